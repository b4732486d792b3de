# gpucr, the command-line front end.
CLI_SRC := $(wildcard cli/*.c)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)

$(CLI_OBJ): $(PROTO_H)

$(BUILD)/bin/gpucr: $(CLI_OBJ) $(COMMON_LIB)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(COMMON_LIB) $(LDFLAGS) $(STATIC_LIBS)

ALL += $(BUILD)/bin/gpucr
