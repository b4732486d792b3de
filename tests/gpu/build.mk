# Programs of the real-GPU suite, built with nvcc for Hopper (sm_90) with
# PTX for newer GPUs. Built for `make bundle`, not for the CPU test suite.
NVCC ?= $(CUDA_HOME)/bin/nvcc
NVCC_FLAGS ?= -O2 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90

GPU_PROGS := $(BUILD)/tests/gpu/cuda-prog

# -Ilibintercept: gpucr_shim.h, for cuda-prog --counts.
$(BUILD)/tests/gpu/%: tests/gpu/%.cu libintercept/gpucr_shim.h
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) -Xcompiler -Wall,-Wextra -Ilibintercept -o $@ $< -ldl

.PHONY: gpu-progs
gpu-progs: $(GPU_PROGS)
