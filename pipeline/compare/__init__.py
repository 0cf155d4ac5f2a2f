"""`pipeline compare`: each workload's comparer, which workloads.comparer picks: tensor.py
for forward recipes (its pages and plots: render.py), generation.py for generation recipes
(its task scores: generation_scores.py)."""
