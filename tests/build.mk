# Unit tests of common/ and the test runner's own pieces. Each test is one
# executable: exit 0 pass, 1 fail, 77 skip (tests/unit/t.h).

UNIT_COMMON := frame msg image err fingerprint log
UNIT_COMMON_BIN := $(UNIT_COMMON:%=$(BUILD)/tests/unit-%)

$(BUILD)/tests/unit-%: $(BUILD)/tests/unit/test-%.o $(COMMON_LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(COMMON_LIB) $(LDFLAGS) -lpthread

TESTS += $(UNIT_COMMON_BIN)

# End-to-end tests: scripts, and the small programs they drive.
E2E_BIN := $(BUILD)/tests/e2e-subreaper $(BUILD)/tests/e2e-counter $(BUILD)/tests/e2e-mkimage

$(BUILD)/tests/e2e-%: $(BUILD)/tests/e2e/%.o
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(LDFLAGS)

ALL += $(E2E_BIN)
TEST_SCRIPTS += $(sort $(wildcard tests/e2e/*.sh))

$(BUILD)/tests/e2e-mkimage: $(BUILD)/tests/e2e/mkimage.o $(COMMON_LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(COMMON_LIB) $(LDFLAGS) -lpthread

$(BUILD)/tests/daemon-proto: $(BUILD)/tests/e2e/daemon-proto.o $(COMMON_LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(COMMON_LIB) $(LDFLAGS) -lpthread

TESTS += $(BUILD)/tests/daemon-proto

# Daemon dump/restore, and pre-copy for migration, against the test driver
# (needs tests/fakecuda).
DAEMON_FAKE_TESTS := daemon-dump daemon-precopy
$(DAEMON_FAKE_TESTS:%=$(BUILD)/tests/e2e/%.o): CFLAGS += -Itests/fakecuda
$(DAEMON_FAKE_TESTS:%=$(BUILD)/tests/%): $(BUILD)/tests/%: $(BUILD)/tests/e2e/%.o $(COMMON_LIB) $(BUILD)/fakecuda/libcuda.so.1
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(COMMON_LIB) $(LDFLAGS) -L$(BUILD)/fakecuda -Wl,-rpath,'$$ORIGIN/../fakecuda' \
		-lcuda -lpthread -ldl

TESTS += $(DAEMON_FAKE_TESTS:%=$(BUILD)/tests/%)

# The CUDA application of the end-to-end C/R tests on the test driver.
$(BUILD)/tests/e2e/fake-app.o: CFLAGS += -Itests/fakecuda
$(BUILD)/tests/e2e-fake-app: $(BUILD)/tests/e2e/fake-app.o $(BUILD)/fakecuda/libcuda.so.1
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(LDFLAGS) -L$(BUILD)/fakecuda -lcuda -ldl

ALL += $(BUILD)/tests/e2e-fake-app
