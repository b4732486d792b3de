# Unit tests of common/ and the test runner's own pieces. Each test is one
# executable: exit 0 pass, 1 fail, 77 skip (tests/unit/t.h).

UNIT_COMMON := frame msg image err fingerprint log
UNIT_COMMON_BIN := $(UNIT_COMMON:%=$(BUILD)/tests/unit-%)

$(BUILD)/tests/unit-%: $(BUILD)/tests/unit/test-%.o $(COMMON_LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(COMMON_LIB) $(LDFLAGS) -lpthread

TESTS += $(UNIT_COMMON_BIN)
