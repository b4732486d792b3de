# gpucr_plugin.so, loaded by CRIU from its plugin directory. It carries
# gpucr's common code (with protobuf-c's runtime) inside; what it uses of
# CRIU (criu_get_image_dir, print_on_level) is looked up at run time.
PLUGIN_SRC := $(wildcard criu-plugin/*.c)
PLUGIN_OBJ := $(PLUGIN_SRC:%.c=$(BUILD)/%.o)

$(PLUGIN_OBJ): CFLAGS += -I$(CRIU_INCLUDE)
$(PLUGIN_OBJ): $(PROTO_H)

$(BUILD)/lib/criu/gpucr_plugin.so: $(PLUGIN_OBJ) $(COMMON_LIB) criu-plugin/plugin.map
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -shared -o $@ $(PLUGIN_OBJ) $(COMMON_LIB) $(LDFLAGS) -Wl,-z,defs \
		-Wl,--version-script=criu-plugin/plugin.map -ldl -lpthread

ALL += $(BUILD)/lib/criu/gpucr_plugin.so
