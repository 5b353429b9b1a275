"""GPU stand-ins beside NVML in a simulated node's driver root: nvidia-smi and libcuda (C; see the Makefile)."""
