/* Slabs: a bitmap of 256-byte units over a VMM region, per device a list of
 * slabs. See slab.h. */
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "slab.h"

struct slab {
	struct region *region;
	struct slab *next;     /* on the device's list */
	size_t nunits;
	size_t nfree;
	size_t hint;           /* where the next search starts */
	uint64_t used[];       /* bit per unit, 1 = in use */
};

static struct slab *slabs[VMM_MAX_DEVICES];

static bool unit_used(const struct slab *s, size_t i)
{
	return s->used[i / 64] >> (i % 64) & 1;
}

static void mark(struct slab *s, size_t first, size_t n, bool used)
{
	for (size_t i = first; i < first + n; i++) {
		if (used)
			s->used[i / 64] |= 1ULL << (i % 64);
		else
			s->used[i / 64] &= ~(1ULL << (i % 64));
	}
	s->nfree = used ? s->nfree - n : s->nfree + n;
}

/* First run of n free units in [from, to); returns its start or SIZE_MAX. */
static size_t find_run(const struct slab *s, size_t from, size_t to, size_t n)
{
	size_t i = from;

	while (i + n <= to) {
		size_t j;

		if (s->used[i / 64] == ~0ULL) {
			i = (i / 64 + 1) * 64;
			continue;
		}
		if (unit_used(s, i)) {
			i++;
			continue;
		}
		for (j = i; j < i + n && !unit_used(s, j); j++)
			;
		if (j == i + n)
			return i;
		i = j + 1;
	}
	return SIZE_MAX;
}

static int slab_new(int device, struct slab **ret)
{
	struct region *r;
	struct slab *s;
	size_t nunits;
	int err;

	err = vmm_region_create(device, SLAB_SIZE, &r);
	if (err)
		return err;
	nunits = r->size / ALLOC_ALIGN;
	s = calloc(1, sizeof(*s) + (nunits + 63) / 64 * sizeof(uint64_t));
	if (!s) {
		vmm_region_destroy(r);
		return -ENOMEM;
	}
	s->region = r;
	s->nunits = nunits;
	s->nfree = nunits;
	r->slab = s;
	s->next = slabs[device];
	slabs[device] = s;
	*ret = s;
	return 0;
}

int slab_alloc(int device, size_t size, CUdeviceptr *ret_ptr, struct region **ret_region)
{
	size_t n = SHIM_ALIGN_UP(size, ALLOC_ALIGN) / ALLOC_ALIGN;
	size_t at = SIZE_MAX;
	struct slab *s;
	int err;

	if (device < 0 || device >= VMM_MAX_DEVICES || !size || size >= ALLOC_SUB_MAX)
		return -EINVAL;
	for (s = slabs[device]; s; s = s->next) {
		if (s->nfree < n)
			continue;
		at = find_run(s, s->hint, s->nunits, n);
		if (at == SIZE_MAX)
			at = find_run(s, 0, s->hint + n - 1 < s->nunits ? s->hint + n - 1 : s->nunits, n);
		if (at != SIZE_MAX)
			break;
	}
	if (!s) {
		err = slab_new(device, &s);
		if (err)
			return err;
		at = 0;
	}
	mark(s, at, n, true);
	s->hint = at + n < s->nunits ? at + n : 0;
	*ret_ptr = s->region->va + at * ALLOC_ALIGN;
	*ret_region = s->region;
	return 0;
}

void slab_free(struct region *r, CUdeviceptr ptr, size_t size)
{
	struct slab *s = r->slab, *o, **pp;
	size_t n = SHIM_ALIGN_UP(size, ALLOC_ALIGN) / ALLOC_ALIGN;
	int device = r->device;

	mark(s, (ptr - r->va) / ALLOC_ALIGN, n, false);
	if (s->nfree != s->nunits)
		return;
	s->hint = 0;
	/* Keep one empty slab per device; destroy this one if another is kept. */
	for (o = slabs[device]; o; o = o->next)
		if (o != s && o->nfree == o->nunits)
			break;
	if (!o)
		return;
	for (pp = &slabs[device]; *pp != s; pp = &(*pp)->next)
		;
	*pp = s->next;
	vmm_region_destroy(r);
	free(s);
}

void slab_trim(void)
{
	for (int d = 0; d < VMM_MAX_DEVICES; d++) {
		struct slab **pp = &slabs[d];

		while (*pp) {
			struct slab *s = *pp;

			if (s->nfree == s->nunits) {
				*pp = s->next;
				vmm_region_destroy(s->region);
				free(s);
			} else {
				pp = &s->next;
			}
		}
	}
}
