# gpucrd, the per-host daemon.
DAEMON_SRC := $(wildcard daemon/*.c)
DAEMON_OBJ := $(DAEMON_SRC:%.c=$(BUILD)/%.o)

$(DAEMON_OBJ): $(PROTO_H)

$(BUILD)/bin/gpucrd: $(DAEMON_OBJ) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $(DAEMON_OBJ) $(COMMON_LIB) $(LDFLAGS) $(STATIC_LIBS)

ALL += $(BUILD)/bin/gpucrd
