"""Device functions several kernels share: a row's normalisation statistics (stats.py), the online-softmax
step (softmax.py) and the rotary rotation (rotate.py)."""
