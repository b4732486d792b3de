# gpucrd, the per-host daemon. Its fingerprint kernel is compiled to PTX
# with nvcc and embedded; the driver is loaded at run time (common/cudrv.c).
NVCC ?= $(CUDA_HOME)/bin/nvcc
DAEMON_SRC := $(wildcard daemon/*.c)
DAEMON_OBJ := $(DAEMON_SRC:%.c=$(BUILD)/%.o) $(BUILD)/gen/daemon/fpkernel_ptx.o

$(DAEMON_OBJ): $(PROTO_H)

$(BUILD)/gen/daemon/fpkernel.ptx: daemon/fpkernel.cu
	@mkdir -p $(@D)
	$(NVCC) -ptx -arch=compute_90 -o $@ $<

$(BUILD)/gen/daemon/fpkernel_ptx.c: $(BUILD)/gen/daemon/fpkernel.ptx daemon/embed-ptx.sh
	sh daemon/embed-ptx.sh gpucr_fp_ptx $< > $@.tmp && mv $@.tmp $@

$(BUILD)/gen/daemon/fpkernel_ptx.o: $(BUILD)/gen/daemon/fpkernel_ptx.c
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/bin/gpucrd: $(DAEMON_OBJ) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $(DAEMON_OBJ) $(COMMON_LIB) $(LDFLAGS) $(STATIC_LIBS)

ALL += $(BUILD)/bin/gpucrd
