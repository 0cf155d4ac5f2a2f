"""The performance model: what each node of an ONNX engine costs at a given shape and how
long it must take at least on a device of the hardware database.

shapes.py binds the graph's symbolic dims (batch, sequence, past_sequence ...) and infers
every value's shape; costs.py counts each node's arithmetic (by formula for the matrix and
attention ops) and the bytes it moves (initializers in their stored precision); model.py puts
them on a HardwareEntry's roofline: max(compute time at the data type's peak, memory time at
the bandwidth) per node, and the bound it sits under.
"""
