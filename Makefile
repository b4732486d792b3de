# gpucr: transparent GPU checkpoint/restore.
#
#   make            build everything into $(BUILD)/
#   make test       install missing dependencies, build, run the CPU test suite
#   make demo       the main job, end to end (see README.md)
#   make ASAN=1 test   the suite under AddressSanitizer + UBSan
#   make install    PREFIX=/usr/local DESTDIR=
#   make bundle     self-contained folder + tarball for GPU hosts
#   make gpu-test   the real-GPU suite (on a GPU host, from the bundle)
#   make bench      side-by-side benchmarks against CRIU's cuda plugin (GPU host)

VERSION := 0.1.0
ifeq ($(ASAN),1)
BUILD ?= build-asan
else
BUILD ?= build
endif
CUDA_HOME ?= /usr/local/cuda
DEPS_PREFIX ?= /usr/local
PREFIX ?= /usr/local
DESTDIR ?=
# CRIU 4.1.1 as built by scripts/install-deps.sh looks for plugins here.
CRIU_PLUGINDIR ?= /usr/lib/criu
PBC_SRC ?= $(DEPS_PREFIX)/src/gpucr-deps/protobuf-c-1.4.1/protobuf-c/protobuf-c.c
CRIU_INCLUDE ?= $(DEPS_PREFIX)/include/criu

CC ?= gcc
PROTOC_C ?= protoc-c

CFLAGS_OPT ?= -O2 -g
CFLAGS := -std=gnu11 $(CFLAGS_OPT) -Wall -Wextra -Werror -D_GNU_SOURCE -fPIC \
	-fno-strict-aliasing -fvisibility=hidden \
	-DGPUCR_VERSION=\"$(VERSION)\" \
	-I$(CUDA_HOME)/include -Icommon -I$(BUILD)/gen
LDFLAGS ?=
ifeq ($(ASAN),1)
CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

# Executables carry liburing and libuv inside them (static), so a bundle runs
# on hosts that have neither; protobuf-c's runtime is compiled from source
# with -fPIC (Debian's static one is not position-independent) into
# libgpucr-common.a, which shared objects link too.
STATIC_LIBS := -Wl,-Bstatic -luring -luv_a -Wl,-Bdynamic -lpthread -ldl -lm

ALL :=
TESTS :=
TEST_SCRIPTS :=

.PHONY: all
all: build-all

# Keep intermediate objects: rebuilding them every time costs more than disk.
.SECONDARY:

# ---- generated protocol and image code ------------------------------------
PROTOS := image rpc
PROTO_C := $(PROTOS:%=$(BUILD)/gen/proto/%.pb-c.c)
PROTO_H := $(PROTOS:%=$(BUILD)/gen/proto/%.pb-c.h)

$(BUILD)/gen/proto/%.pb-c.c $(BUILD)/gen/proto/%.pb-c.h: proto/%.proto
	@mkdir -p $(@D)
	$(PROTOC_C) --c_out=$(BUILD)/gen/proto -Iproto $<

$(BUILD)/gen/cuda-errors.inc: common/gen-cuda-errors.awk $(CUDA_HOME)/include/cuda.h
	@mkdir -p $(@D)
	awk -f common/gen-cuda-errors.awk $(CUDA_HOME)/include/cuda.h > $@.tmp && mv $@.tmp $@

# ---- common ---------------------------------------------------------------
COMMON_SRC := $(wildcard common/*.c)
COMMON_OBJ := $(COMMON_SRC:%.c=$(BUILD)/%.o) $(PROTOS:%=$(BUILD)/gen/proto/%.pb-c.o) \
	$(BUILD)/pbc/protobuf-c.o
COMMON_LIB := $(BUILD)/libgpucr-common.a

$(BUILD)/common/err.o: $(BUILD)/gen/cuda-errors.inc
$(COMMON_SRC:%.c=$(BUILD)/%.o): $(PROTO_H)

$(BUILD)/pbc/protobuf-c.o: $(PBC_SRC)
	@mkdir -p $(@D)
	@test -f $(PBC_SRC) || { echo "missing $(PBC_SRC): run scripts/install-deps.sh (as root)"; exit 1; }
	$(CC) -std=gnu11 -O2 -g -fPIC -fvisibility=hidden -w -c $< -o $@

$(BUILD)/gen/proto/%.pb-c.o: $(BUILD)/gen/proto/%.pb-c.c $(PROTO_H)
	$(CC) $(CFLAGS) -c $< -o $@

$(COMMON_LIB): $(COMMON_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

# Objects of the project's own sources; headers tracked through -MMD.
$(BUILD)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# ---- parts ----------------------------------------------------------------
include $(wildcard tests/fakecuda/build.mk)
include $(wildcard libintercept/build.mk)
include $(wildcard daemon/build.mk)
include $(wildcard cli/build.mk)
include $(wildcard criu-plugin/build.mk)
include $(wildcard bench/build.mk)
include tests/build.mk
include tests/gpu/build.mk

.PHONY: build-all
build-all: $(COMMON_LIB) $(ALL) $(TESTS)

# ---- dependencies ---------------------------------------------------------
.PHONY: deps
deps:
	@bash scripts/install-deps.sh

# ---- tests ----------------------------------------------------------------
.PHONY: test check
test: deps
	@$(MAKE) --no-print-directory build-all
	@BUILD=$(BUILD) bash tests/run-tests.sh $(TESTS) $(TEST_SCRIPTS)
check: test

# ---- demo -----------------------------------------------------------------
.PHONY: demo
demo: deps
	@$(MAKE) --no-print-directory build-all
	@BUILD=$(BUILD) bash scripts/demo.sh

# ---- install --------------------------------------------------------------
.PHONY: install
install: build-all
	BUILD=$(BUILD) PREFIX=$(PREFIX) DESTDIR=$(DESTDIR) CRIU_PLUGINDIR=$(CRIU_PLUGINDIR) \
		bash scripts/install.sh

# ---- bundle ---------------------------------------------------------------
.PHONY: bundle
bundle: deps
	@$(MAKE) --no-print-directory build-all gpu-progs
	BUILD=$(BUILD) VERSION=$(VERSION) DEPS_PREFIX=$(DEPS_PREFIX) bash scripts/bundle.sh

# ---- GPU host targets -----------------------------------------------------
.PHONY: gpu-test bench
gpu-test:
	@bash tests/gpu/run.sh
bench:
	@bash bench/run.sh

.PHONY: clean
clean:
	rm -rf $(BUILD)
