"""Measuring the decoder from outside: traffic booked by operation name, device time profiled at the
run's own positions, kernels counted by torch.profiler, tidy frames and summaries, sweeps."""
