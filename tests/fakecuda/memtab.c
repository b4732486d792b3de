/* fakecuda memtab: the sorted tables of mapped device memory (regions) and
 * reserved address ranges, lookups by address, and the range checks that
 * copies, memsets and pointer queries make against them. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"

struct fk_tab fk_regions = { NULL, 0, 0, sizeof(struct fk_region) };
struct fk_tab fk_resvs = { NULL, 0, 0, sizeof(struct fk_resv) };

struct fk_span {
	uintptr_t base;
	size_t size;
};

static const struct fk_span *span_at(const struct fk_tab *t, size_t i)
{
	return (const struct fk_span *)(const void *)((const char *)t->v + i * t->esz);
}

size_t fk_tab_lower(const struct fk_tab *t, uintptr_t p)
{
	size_t lo = 0, hi = t->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (span_at(t, mid)->base < p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

ssize_t fk_tab_find(const struct fk_tab *t, uintptr_t p)
{
	size_t i = fk_tab_lower(t, p);
	const struct fk_span *s;

	if (i < t->n && span_at(t, i)->base == p)
		return (ssize_t)i;
	if (i == 0)
		return -1;
	s = span_at(t, i - 1);
	if (p - s->base < s->size)
		return (ssize_t)(i - 1);
	return -1;
}

int fk_tab_insert(struct fk_tab *t, const void *e)
{
	const struct fk_span *s = e;
	size_t i;

	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 64;
		void *v = realloc(t->v, cap * t->esz);

		if (!v)
			return -ENOMEM;
		t->v = v;
		t->cap = cap;
	}
	i = fk_tab_lower(t, s->base);
	memmove((char *)t->v + (i + 1) * t->esz, (char *)t->v + i * t->esz, (t->n - i) * t->esz);
	memcpy((char *)t->v + i * t->esz, e, t->esz);
	t->n++;
	return 0;
}

void fk_tab_remove(struct fk_tab *t, size_t i)
{
	memmove((char *)t->v + i * t->esz, (char *)t->v + (i + 1) * t->esz, (t->n - i - 1) * t->esz);
	t->n--;
}

static CUresult check_locked(uintptr_t p, size_t n, int prot)
{
	ssize_t i = fk_tab_find(&fk_regions, p);

	if (i < 0)
		return CUDA_ERROR_INVALID_VALUE;
	/* A range may run over adjacent VMM mappings (gpucr maps a buffer as
	 * consecutive 2 MiB chunks); each must grant the access.  Separate
	 * cuMemAlloc blocks that happen to be adjacent do not join. */
	for (int first = 1;; first = 0) {
		struct fk_region *r = FK_TAB_AT(&fk_regions, i, struct fk_region);
		size_t avail;

		if (p < r->base || p - r->base >= r->size)
			return CUDA_ERROR_INVALID_VALUE;
		if ((r->prot & prot) != prot || (!first && r->kind != FK_VMM))
			return CUDA_ERROR_INVALID_VALUE;
		avail = r->size - (p - r->base);
		if (n <= avail)
			return CUDA_SUCCESS;
		if (r->kind != FK_VMM)
			return CUDA_ERROR_INVALID_VALUE;
		n -= avail;
		p += avail;
		if ((size_t)++i >= fk_regions.n)
			return CUDA_ERROR_INVALID_VALUE;
	}
}

CUresult fk_check_dev(uintptr_t p, size_t n, int prot)
{
	CUresult rc;

	if (n == 0)
		return CUDA_SUCCESS;
	if (p + n < p)
		return CUDA_ERROR_INVALID_VALUE;
	fk_lock_take();
	rc = check_locked(p, n, prot);
	fk_lock_drop();
	return rc;
}

CUresult fk_check_any(uintptr_t p, size_t n, int prot)
{
	CUresult rc = CUDA_SUCCESS;

	if (n == 0)
		return CUDA_SUCCESS;
	fk_lock_take();
	if (fk_tab_find(&fk_regions, p) >= 0)
		rc = check_locked(p, n, prot);
	else if (fk_tab_find(&fk_resvs, p) >= 0)
		rc = CUDA_ERROR_INVALID_VALUE;  /* reserved, nothing mapped */
	fk_lock_drop();
	return rc;
}

/* Every handle object ever made, so that none is freed (a stale handle
 * then reads FK_DEAD, not freed memory) and none counts as leaked under
 * LeakSanitizer: all stay reachable from here. */
static pthread_mutex_t objects_lock = PTHREAD_MUTEX_INITIALIZER;  /* a leaf */
static void **objects;
static size_t nobjects, objects_cap;

void *fk_obj_alloc(size_t size)
{
	void *p = calloc(1, size);

	if (!p)
		return NULL;
	pthread_mutex_lock(&objects_lock);
	if (nobjects == objects_cap) {
		size_t cap = objects_cap ? objects_cap * 2 : 256;
		void **v = realloc(objects, cap * sizeof(*v));

		if (!v) {
			pthread_mutex_unlock(&objects_lock);
			free(p);
			return NULL;
		}
		objects = v;
		objects_cap = cap;
	}
	objects[nobjects++] = p;
	pthread_mutex_unlock(&objects_lock);
	return p;
}

unsigned long long fk_next_id(void)
{
	static unsigned long long next = 1;

	return __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED);
}
