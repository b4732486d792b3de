# tests/fakecuda/build.mk: builds the fake CUDA driver and its tests.
# Included by the top-level Makefile and run from the repository root; uses
# BUILD, CC, CFLAGS, LDFLAGS and CUDA_HOME from there.
#
#   $(BUILD)/fakecuda/libcuda.so.1   the fake driver (soname libcuda.so.1),
#   $(BUILD)/fakecuda/libcuda.so     symlink for -lcuda      -> appended to ALL
#   $(BUILD)/tests/fakecuda-NAME     one per tests/fakecuda/test-NAME.c
#                                                            -> appended to TESTS
#
# A program runs on the fake when it links with $(FAKECUDA_LINK) or finds
# $(FAKECUDA_DIR) first on LD_LIBRARY_PATH.

FAKECUDA_SRC := tests/fakecuda
FAKECUDA_DIR := $(BUILD)/fakecuda
FAKECUDA_LIB := $(FAKECUDA_DIR)/libcuda.so.1
FAKECUDA_MODULES := alloc ckpt context copy device errors gate graph memtab module procaddr stream vmm host
FAKECUDA_OBJS := $(FAKECUDA_MODULES:%=$(FAKECUDA_DIR)/%.o) $(FAKECUDA_DIR)/gen-stubs.o
FAKECUDA_TESTS := $(patsubst $(FAKECUDA_SRC)/test-%.c,$(BUILD)/tests/fakecuda-%,$(wildcard $(FAKECUDA_SRC)/test-*.c))
# For a test binary in $(BUILD)/tests (or anything one level below $(BUILD)).
FAKECUDA_LINK := -L$(FAKECUDA_DIR) -Wl,-rpath,'$$ORIGIN/../fakecuda' -lcuda -ldl -lpthread

# Exports come from cuda.h's own visibility push plus FAKECUDA_API;
# everything else stays hidden.  -Bsymbolic: the fake's calls to itself must
# not be captured by an interposing libcuda.so.1 (gpucr's interceptor).
FAKECUDA_CFLAGS = $(CFLAGS) -fPIC -fvisibility=hidden -D__CUDA_API_PUSH_VISIBILITY_DEFAULT \
	-I$(FAKECUDA_SRC) -I$(FAKECUDA_DIR) -MMD -MP

ALL += $(FAKECUDA_LIB) $(FAKECUDA_DIR)/libcuda.so
TESTS += $(FAKECUDA_TESTS)

$(FAKECUDA_DIR)/gen-errors.h: $(FAKECUDA_SRC)/gen.sh $(CUDA_HOME)/include/cuda.h
	@mkdir -p $(@D)
	sh $(FAKECUDA_SRC)/gen.sh errors '$(CC)' '$(CUDA_HOME)/include' $@

$(FAKECUDA_DIR)/gen-stubs.c: $(FAKECUDA_SRC)/gen.sh $(CUDA_HOME)/include/cuda.h
	@mkdir -p $(@D)
	sh $(FAKECUDA_SRC)/gen.sh stubs '$(CC)' '$(CUDA_HOME)/include' $@

$(FAKECUDA_DIR)/errors.o: $(FAKECUDA_DIR)/gen-errors.h

$(FAKECUDA_MODULES:%=$(FAKECUDA_DIR)/%.o): $(FAKECUDA_DIR)/%.o: $(FAKECUDA_SRC)/%.c
	@mkdir -p $(@D)
	$(CC) $(FAKECUDA_CFLAGS) -c -o $@ $<

$(FAKECUDA_DIR)/gen-stubs.o: $(FAKECUDA_DIR)/gen-stubs.c
	$(CC) $(FAKECUDA_CFLAGS) -c -o $@ $<

$(FAKECUDA_LIB): $(FAKECUDA_OBJS) $(FAKECUDA_SRC)/fakecuda.map
	$(CC) -shared -Wl,-soname,libcuda.so.1 -Wl,--version-script=$(FAKECUDA_SRC)/fakecuda.map \
		-Wl,-Bsymbolic -Wl,-z,defs -o $@ $(FAKECUDA_OBJS) $(LDFLAGS) -ldl -lpthread

$(FAKECUDA_DIR)/libcuda.so: $(FAKECUDA_LIB)
	ln -sf libcuda.so.1 $@

$(FAKECUDA_TESTS): $(BUILD)/tests/fakecuda-%: $(FAKECUDA_SRC)/test-%.c $(FAKECUDA_SRC)/fakecuda.h \
		$(FAKECUDA_SRC)/testutil.h $(FAKECUDA_LIB) $(FAKECUDA_DIR)/libcuda.so
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -I$(FAKECUDA_SRC) -o $@ $< $(LDFLAGS) $(FAKECUDA_LINK)

.PHONY: fakecuda
fakecuda: $(FAKECUDA_LIB) $(FAKECUDA_DIR)/libcuda.so $(FAKECUDA_TESTS)

-include $(FAKECUDA_OBJS:.o=.d)
