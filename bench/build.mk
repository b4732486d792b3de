# bench/build.mk: the open `cuda-checkpoint` stand-in that lets CRIU's stock
# cuda plugin (the benchmark baseline) run where NVIDIA's utility is absent.
# Included from the repo root by the top-level Makefile, which must set BUILD,
# CC, CFLAGS, LDFLAGS and CUDA_HOME before the include (targets expand at parse
# time). Links against the driver stub; the real libcuda.so.1 (same SONAME) is
# used at run time.

CUDA_CHECKPOINT_BIN := $(BUILD)/bin/cuda-checkpoint

ALL += $(CUDA_CHECKPOINT_BIN)

$(CUDA_CHECKPOINT_BIN): bench/cuda-checkpoint.c bench/build.mk
	@mkdir -p $(@D)
	$(CC) -std=gnu11 -D_GNU_SOURCE $(CFLAGS) -I$(CUDA_HOME)/include -o $@ $< \
		$(LDFLAGS) -L$(CUDA_HOME)/lib64/stubs -lcuda

# imgbench: gpucrd's image engine alone on a real GPU (GB/s in and out,
# fingerprint kernel checked against the CPU definition).
IMGBENCH_DAEMON_OBJ := $(filter $(BUILD)/daemon/gpu.o $(BUILD)/daemon/imgio.o $(BUILD)/daemon/registry.o \
	$(BUILD)/gen/daemon/fpkernel_ptx.o,$(DAEMON_OBJ))
$(BUILD)/bench/imgbench.o: CFLAGS += -Idaemon
$(BUILD)/bench/imgbench.o: $(PROTO_H)
$(BUILD)/bin/imgbench: $(BUILD)/bench/imgbench.o $(IMGBENCH_DAEMON_OBJ) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(STATIC_LIBS)

ALL += $(BUILD)/bin/imgbench

# shimcost: what the shim adds per launch, per allocation and free, and to
# pinned copies (bench/shimcost.sh runs it with and without the shim). Built
# with nvcc like the real-GPU suite's programs, for `make bundle` (gpu-progs)
# only; the driver API is linked from the stub, the shim or the real
# libcuda.so.1 is picked at run time.
SHIMCOST_BIN := $(BUILD)/bin/shimcost

$(SHIMCOST_BIN): bench/shimcost.cu bench/build.mk libintercept/gpucr_shim.h
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) -Xcompiler -Wall,-Wextra -Ilibintercept -o $@ $< -L$(CUDA_HOME)/lib64/stubs -lcuda -ldl

gpu-progs: $(SHIMCOST_BIN)
