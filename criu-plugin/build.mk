# gpucr_plugin.so, loaded by CRIU from its plugin directory. It carries
# gpucr's common code (with protobuf-c's runtime) inside; what it uses of
# CRIU (criu_get_image_dir, print_on_level) is looked up at run time.
# CRIU is not built with sanitizers, so under ASAN=1 the plugin and the
# common code it carries are built without them.
PLUGIN_SRC := $(wildcard criu-plugin/*.c)

ifeq ($(ASAN),1)
PLUGIN_CFLAGS := $(filter-out -fsanitize=% -fno-sanitize-recover=% -fno-omit-frame-pointer,$(CFLAGS))
PLUGIN_LDFLAGS := $(filter-out -fsanitize=%,$(LDFLAGS))
PLUGIN_OBJ := $(PLUGIN_SRC:%.c=$(BUILD)/nosan/%.o)
PLUGIN_COMMON := $(COMMON_SRC:%.c=$(BUILD)/nosan/%.o) $(PROTOS:%=$(BUILD)/nosan/proto/%.pb-c.o) \
	$(BUILD)/pbc/protobuf-c.o

$(BUILD)/nosan/%.o: %.c $(PROTO_H) $(BUILD)/gen/cuda-errors.inc
	@mkdir -p $(@D)
	$(CC) $(PLUGIN_CFLAGS) -I$(CRIU_INCLUDE) -c $< -o $@

$(BUILD)/nosan/proto/%.pb-c.o: $(BUILD)/gen/proto/%.pb-c.c $(PROTO_H)
	@mkdir -p $(@D)
	$(CC) $(PLUGIN_CFLAGS) -c $< -o $@
else
PLUGIN_CFLAGS := $(CFLAGS)
PLUGIN_LDFLAGS := $(LDFLAGS)
PLUGIN_OBJ := $(PLUGIN_SRC:%.c=$(BUILD)/%.o)
PLUGIN_COMMON := $(COMMON_LIB)

$(PLUGIN_OBJ): CFLAGS += -I$(CRIU_INCLUDE)
$(PLUGIN_OBJ): $(PROTO_H)
endif

$(BUILD)/lib/criu/gpucr_plugin.so: $(PLUGIN_OBJ) $(PLUGIN_COMMON) criu-plugin/plugin.map
	@mkdir -p $(@D)
	$(CC) $(PLUGIN_CFLAGS) -shared -o $@ $(PLUGIN_OBJ) $(PLUGIN_COMMON) $(PLUGIN_LDFLAGS) -Wl,-z,defs \
		-Wl,--version-script=criu-plugin/plugin.map -ldl -lpthread

ALL += $(BUILD)/lib/criu/gpucr_plugin.so
