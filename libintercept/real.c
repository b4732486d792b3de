/* Finds the real driver by path, loads it once, and resolves the entry points
 * that gpucr calls (struct real_driver) and those it wraps (real_wrapped).
 * See real.h for the search rules. */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "real.h"

struct real_driver real;
void *real_wrapped[WRAP_COUNT];
int real_loaded;

static pthread_once_t real_once = PTHREAD_ONCE_INIT;

/* Where distributions, container runtimes and WSL put the driver. */
static const char *const real_std_paths[] = {
	"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
	"/usr/lib64/libcuda.so.1",
	"/usr/lib/libcuda.so.1",
	"/usr/local/nvidia/lib64/libcuda.so.1",
	"/usr/local/nvidia/lib/libcuda.so.1",
	"/usr/lib/wsl/lib/libcuda.so.1",
	"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1",
	"/run/nvidia/driver/usr/lib64/libcuda.so.1",
};

/* Who the shim is, to refuse loading itself as "the real driver". */
struct self_id {
	struct link_map *map;
	dev_t dev;
	ino_t ino;
	bool have_file;
};

static void self_identify(struct self_id *self)
{
	Dl_info info;
	void *extra = NULL;
	struct stat st;

	memset(self, 0, sizeof(*self));
	if (!dladdr1((void *)&real_load_once, &info, &extra, RTLD_DL_LINKMAP))
		return;
	self->map = extra;
	if (info.dli_fname && info.dli_fname[0] && stat(info.dli_fname, &st) == 0) {
		self->dev = st.st_dev;
		self->ino = st.st_ino;
		self->have_file = true;
	}
}

/* Returns the handle, or NULL with a reason in why (empty: no such file). */
static void *real_try_open(const char *path, const struct self_id *self, char *why, size_t whylen)
{
	struct link_map *map = NULL;
	struct stat st;
	void *h;

	why[0] = '\0';
	/* A bare name is the loader's to search; the link map check below
	 * catches it finding the shim. */
	if (strchr(path, '/')) {
		if (stat(path, &st) < 0) {
			if (errno != ENOENT)
				snprintf(why, whylen, "%s", strerror(errno));
			return NULL;
		}
		if (self->have_file && st.st_dev == self->dev && st.st_ino == self->ino) {
			snprintf(why, whylen, "it is gpucr's shim itself, not the driver");
			return NULL;
		}
	}
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();

		snprintf(why, whylen, "%s", e ? e : "dlopen failed");
		return NULL;
	}
	/* A name without a slash, or a copy that the loader matched by soname,
	 * can still hand back this very object. */
	if (dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map && map == self->map) {
		dlclose(h);
		snprintf(why, whylen, "it resolves to gpucr's shim itself, not the driver");
		return NULL;
	}
	return h;
}

static void real_resolve(void *h)
{
	size_t i;

#define REAL_RESOLVE(name) real.name = (__typeof__(real.name))dlsym(h, #name);
	REAL_FNS(REAL_RESOLVE)
#undef REAL_RESOLVE
	for (i = 0; i < WRAP_COUNT; i++)
		real_wrapped[i] = dlsym(h, wrap_names[i]);
}

static void real_load(void)
{
	const char *env = secure_getenv("GPUCR_REAL_LIBCUDA");
	char why[512];
	struct self_id self;
	void *h = NULL;
	size_t i;

	log_init("gpucr-shim");
	self_identify(&self);

	if (env && env[0]) {
		h = real_try_open(env, &self, why, sizeof(why));
		if (!h) {
			pr_err("cannot load the CUDA driver from GPUCR_REAL_LIBCUDA=%s: %s; "
			       "CUDA calls will fail with CUDA_ERROR_NO_DEVICE\n",
			       env, why[0] ? why : "no such file");
			return;
		}
		real.path = env;
	} else {
		char looked[2048];
		size_t n = 0;

		looked[0] = '\0';
		for (i = 0; i < sizeof(real_std_paths) / sizeof(real_std_paths[0]); i++) {
			h = real_try_open(real_std_paths[i], &self, why, sizeof(why));
			if (h) {
				real.path = real_std_paths[i];
				break;
			}
			if (why[0])
				pr_warn("not using %s as the CUDA driver: %s\n", real_std_paths[i], why);
			if (n < sizeof(looked)) {
				int r = snprintf(looked + n, sizeof(looked) - n, "%s%s", n ? ", " : "",
						 real_std_paths[i]);
				if (r > 0)
					n += (size_t)r;
			}
		}
		if (!h) {
			pr_err("no CUDA driver found (GPUCR_REAL_LIBCUDA is not set; looked in %s); "
			       "CUDA calls will fail with CUDA_ERROR_NO_DEVICE\n",
			       looked);
			return;
		}
	}
	real_resolve(h);
	real.handle = h;
	pr_debug("real driver: %s\n", real.path);
}

static void real_load_run(void)
{
	int saved = errno;

	real_load();
	__atomic_store_n(&real_loaded, 1, __ATOMIC_RELEASE);
	errno = saved;
}

void real_load_once(void)
{
	pthread_once(&real_once, real_load_run);
}

static int cmp_wrap_name(const void *key, const void *elem)
{
	return strcmp(key, *(const char *const *)elem);
}

void *real_wrapped_fn(const char *name)
{
	const char *const *hit;

	real_ensure();
	/* wrap_names is sorted (gen-forward.sh sorts wrapped.list). */
	hit = bsearch(name, wrap_names, WRAP_COUNT, sizeof(wrap_names[0]), cmp_wrap_name);
	return hit ? real_wrapped[hit - wrap_names] : NULL;
}

CUresult real_absent(const char *name)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	static const char *told[64];
	static size_t ntold;
	bool tell = true;
	size_t i;

	if (!real.handle)
		return CUDA_ERROR_NO_DEVICE;
	pthread_mutex_lock(&lock);
	for (i = 0; i < ntold; i++)
		if (told[i] == name)
			tell = false;
	if (tell && ntold < sizeof(told) / sizeof(told[0]))
		told[ntold++] = name;
	pthread_mutex_unlock(&lock);
	if (tell)
		pr_err("the CUDA driver %s has no %s; calls to it fail with CUDA_ERROR_NOT_FOUND\n",
		       real.path, name);
	return CUDA_ERROR_NOT_FOUND;
}
