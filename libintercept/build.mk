# libintercept: the driver shim, installed as libcuda.so.1 in gpucr's own lib
# dir ($(BUILD)/lib/gpucr/libcuda.so.1), and its unit tests.
#
# The forwarding layer is generated from the toolkit's stub driver, which
# exports the same names as the real one (gen-forward.sh); wrapped.list names
# the symbols implemented in C, ungated.list the forwarded ones that do not
# test the gate (gate.h), gpucr-exports.list gpucr's own entry points
# (gpucr_shim.h). The link keeps exactly the driver's names and gpucr's own
# (version script) and check-exports.sh verifies it.
#
# Tests (unit-shim-*) run against the fake driver: each sets
# GPUCR_REAL_LIBCUDA=$(BUILD)/fakecuda/libcuda.so.1 itself, unless the
# environment already names a driver, before its first CUDA call (the shim
# loads the driver on first use), and skips (77) when the fake is not built.
# unit-shim-alloc, -procaddr, -forward, -self and -counts link the shim as
# installed;
# unit-shim-control and -control-drop too, with common/ for the fake gpucrd
# they run (tests/unit/fakegpucrd.h); unit-shim-remap, -buftab, -gate, -launch, -dag, -copy, -graph, -chunkgate,
# -suspect, -appvmm and -epoch (which runs the fake gpucrd as well) link its objects
# (libintercept.a) to reach the internal API (alloc.h, buftab.h, gate.h).

SHIM_STUB ?= $(CUDA_HOME)/lib64/stubs/libcuda.so
SHIM_GEN := $(BUILD)/gen/libintercept
SHIM_OBJDIR := $(BUILD)/libintercept
SHIM_LIB := $(BUILD)/lib/gpucr/libcuda.so.1
SHIM_ARCHIVE := $(SHIM_OBJDIR)/libintercept.a

SHIM_SRC := $(wildcard libintercept/*.c)
SHIM_OBJ := $(SHIM_SRC:libintercept/%.c=$(SHIM_OBJDIR)/%.o) $(SHIM_OBJDIR)/lazy.o \
	$(SHIM_OBJDIR)/gen/fwd_gen.o $(SHIM_OBJDIR)/gen/fwd_gen_S.o
SHIM_GEN_FILES := $(SHIM_GEN)/fwd_gen.h $(SHIM_GEN)/fwd_gen.c $(SHIM_GEN)/fwd_gen.S \
	$(SHIM_GEN)/libcuda.map $(SHIM_GEN)/exports.list

SHIM_CFLAGS = $(CFLAGS) -fPIC -fvisibility=hidden -D__CUDA_API_VERSION_INTERNAL \
	-Ilibintercept -I$(SHIM_GEN)
SHIM_LDFLAGS = -shared -Wl,-soname,libcuda.so.1 -Wl,--version-script=$(SHIM_GEN)/libcuda.map \
	-Wl,-z,defs -Wl,-z,now -Wl,-Bsymbolic $(LDFLAGS)
SHIM_LIBS := -ldl -lpthread

$(SHIM_GEN_FILES) &: libintercept/gen-forward.sh libintercept/wrapped.list libintercept/ungated.list \
		libintercept/gpucr-exports.list $(SHIM_STUB)
	@mkdir -p $(SHIM_GEN)
	sh libintercept/gen-forward.sh $(SHIM_STUB) libintercept/wrapped.list $(SHIM_GEN) \
		libintercept/ungated.list libintercept/gpucr-exports.list

$(SHIM_SRC:libintercept/%.c=$(SHIM_OBJDIR)/%.o): $(SHIM_OBJDIR)/%.o: libintercept/%.c $(SHIM_GEN)/fwd_gen.h
	@mkdir -p $(@D)
	$(CC) $(SHIM_CFLAGS) -MMD -MP -c $< -o $@

$(SHIM_OBJDIR)/lazy.o: libintercept/lazy.S
	@mkdir -p $(@D)
	$(CC) $(SHIM_CFLAGS) -c $< -o $@

$(SHIM_OBJDIR)/gen/fwd_gen.o: $(SHIM_GEN)/fwd_gen.c $(SHIM_GEN)/fwd_gen.h
	@mkdir -p $(@D)
	$(CC) $(SHIM_CFLAGS) -c $< -o $@

$(SHIM_OBJDIR)/gen/fwd_gen_S.o: $(SHIM_GEN)/fwd_gen.S
	@mkdir -p $(@D)
	$(CC) $(SHIM_CFLAGS) -c $< -o $@

$(SHIM_LIB): $(SHIM_OBJ) $(COMMON_LIB) $(SHIM_GEN)/libcuda.map $(SHIM_GEN)/exports.list \
		libintercept/check-exports.sh
	@mkdir -p $(@D)
	$(CC) $(SHIM_CFLAGS) $(SHIM_LDFLAGS) -o $@.tmp $(SHIM_OBJ) $(COMMON_LIB) $(SHIM_LIBS)
	sh libintercept/check-exports.sh $@.tmp $(SHIM_GEN)/exports.list
	mv -f $@.tmp $@

$(SHIM_ARCHIVE): $(SHIM_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

ALL += $(SHIM_LIB)

# ---- tests ----------------------------------------------------------------
SHIM_TESTS_SO := forward procaddr alloc self counts
SHIM_TESTS_SOC := control control-drop
SHIM_TESTS_AR := remap buftab gate launch dag copy graph chunkgate epoch suspect appvmm
SHIM_TEST_BIN := $(SHIM_TESTS_SO:%=$(BUILD)/tests/unit-shim-%) $(SHIM_TESTS_AR:%=$(BUILD)/tests/unit-shim-%) \
	$(SHIM_TESTS_SOC:%=$(BUILD)/tests/unit-shim-%)

SHIM_TEST_CFLAGS = $(CFLAGS) -Itests/unit -Itests/fakecuda -Ilibintercept -I$(SHIM_GEN) \
	-DFAKECUDA_LIB=\"$(abspath $(BUILD))/fakecuda/libcuda.so.1\" \
	-DSHIM_LIB=\"$(abspath $(SHIM_LIB))\"
# The fake is built first when its makefile is part of the build.
SHIM_TEST_FAKE := $(if $(wildcard tests/fakecuda/build.mk),$(BUILD)/fakecuda/libcuda.so.1)

# Their shared headers (shimtest.h, gatetest.h, ...) are prerequisites too:
# these rules keep no dependency files.
SHIM_TEST_HDRS := $(wildcard tests/unit/*.h)

$(SHIM_TESTS_SO:%=$(BUILD)/tests/unit-shim-%): $(BUILD)/tests/unit-shim-%: tests/unit/test-shim-%.c \
		$(SHIM_TEST_HDRS) $(SHIM_LIB) | $(SHIM_TEST_FAKE)
	@mkdir -p $(@D)
	$(CC) $(SHIM_TEST_CFLAGS) -o $@ $< $(SHIM_LIB) -Wl,-rpath,$(abspath $(BUILD))/lib/gpucr \
		$(LDFLAGS) -ldl -lpthread

# Calls the _ptds/_ptsz names directly, as declared under the driver's own view.
$(BUILD)/tests/unit-shim-counts: SHIM_TEST_CFLAGS += -D__CUDA_API_VERSION_INTERNAL

# Linked against the shim as installed, plus common/ for a fake daemon
# (tests/unit/fakegpucrd.h); the shim's own copy of common/ stays hidden.
$(SHIM_TESTS_SOC:%=$(BUILD)/tests/unit-shim-%): $(BUILD)/tests/unit-shim-%: tests/unit/test-shim-%.c \
		$(SHIM_TEST_HDRS) $(SHIM_LIB) $(COMMON_LIB) | $(SHIM_TEST_FAKE)
	@mkdir -p $(@D)
	$(CC) $(SHIM_TEST_CFLAGS) -o $@ $< $(SHIM_LIB) $(COMMON_LIB) -Wl,-rpath,$(abspath $(BUILD))/lib/gpucr \
		$(LDFLAGS) -ldl -lpthread

# Built from the archive: the internal API is hidden in the shared object.
$(SHIM_TESTS_AR:%=$(BUILD)/tests/unit-shim-%): $(BUILD)/tests/unit-shim-%: tests/unit/test-shim-%.c \
		$(SHIM_TEST_HDRS) $(SHIM_ARCHIVE) $(COMMON_LIB) | $(SHIM_TEST_FAKE)
	@mkdir -p $(@D)
	$(CC) $(SHIM_TEST_CFLAGS) -D__CUDA_API_VERSION_INTERNAL -o $@ $< $(SHIM_ARCHIVE) $(COMMON_LIB) \
		$(LDFLAGS) -ldl -lpthread

$(BUILD)/tests/unit-shim-epoch: tests/unit/fakegpucrd.h

TESTS += $(SHIM_TEST_BIN)

-include $(SHIM_OBJ:.o=.d)
