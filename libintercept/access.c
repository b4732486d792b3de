/* Access sets: device ranges of copies and memsets decoded from their
 * parameters, pitched rows merged where a chunk cannot tell them apart.
 * See access.h. */
#include <stdlib.h>
#include <string.h>

#include "access.h"
#include "launch.h"

void access_init(struct access_set *s)
{
	s->n = 0;
	s->cap = ACCESS_INLINE;
	s->r = s->inline_r;
	s->chunk = dag_chunk_size();
	s->unbounded = false;
}

void access_free(struct access_set *s)
{
	if (!s)
		return;
	if (s->r != s->inline_r)
		free(s->r);
	s->r = s->inline_r;
	s->cap = ACCESS_INLINE;
	s->n = 0;
}

static bool grow(struct access_set *s)
{
	size_t cap = s->cap * 2;
	struct dag_range *r;

	if (s->r == s->inline_r) {
		r = malloc(cap * sizeof(*r));
		if (r)
			memcpy(r, s->r, s->n * sizeof(*r));
	} else {
		r = realloc(s->r, cap * sizeof(*r));
	}
	if (!r) {
		s->unbounded = true;
		return false;
	}
	s->r = r;
	s->cap = cap;
	return true;
}

void access_add(struct access_set *s, CUdeviceptr a, size_t len, uint32_t access, uint32_t flags)
{
	struct dag_range *last = s->n ? &s->r[s->n - 1] : NULL;

	if (!a || !len)
		return;
	/* Whole-buffer ranges are not merged: the gap could hold a buffer. */
	if (last && !(flags & DAG_RANGE_WHOLE) && last->flags == flags && last->access == access &&
	    a >= last->addr && a - last->addr <= last->len + s->chunk - 1) {
		if (a + len > last->addr + last->len)
			last->len = a + len - last->addr;
		return;
	}
	if (s->n == s->cap && !grow(s))
		return;
	s->r[s->n++] = (struct dag_range){ .addr = a, .len = len, .access = access, .flags = flags };
}

bool access_kernel(struct access_set *s, CUfunction f, void **kernelParams, void **extra)
{
	struct launch_decoded *d = malloc(sizeof(*d));
	bool ok;

	if (!d) {
		s->unbounded = true;
		return false;
	}
	launch_decode(f, NULL, kernelParams, extra, d);
	ok = !(d->flags & LAUNCH_F_UNKNOWN);
	for (unsigned int i = 0; ok && i < d->ntouch; i++)
		access_add(s, d->touch[i].base, d->touch[i].size, DAG_ACCESS_READ | DAG_ACCESS_WRITE, DAG_RANGE_WHOLE);
	free(d);
	return ok;
}

/* depth slices, slice bytes apart, of height rows of width bytes, pitch
 * apart, from base. */
static void pitched(struct access_set *s, CUdeviceptr base, size_t width, size_t height, size_t pitch,
		    size_t depth, size_t slice, uint32_t access)
{
	size_t first = s->n, span, row_gap;

	if (!base || !width || !height || !depth)
		return;
	if (height == 1 || pitch < width)
		pitch = width; /* one row, or rows that overlap: contiguous */
	span = (height - 1) * pitch + width;
	if (depth == 1 || slice < span)
		slice = span;
	row_gap = pitch - width;
	if (row_gap < s->chunk && slice - span < s->chunk) {
		access_add(s, base, (depth - 1) * slice + span, access, 0);
		return;
	}
	for (size_t z = 0; z < depth; z++) {
		CUdeviceptr sb = base + z * slice;

		if (row_gap < s->chunk) {
			access_add(s, sb, span, access, 0);
		} else {
			for (size_t y = 0; y < height && s->n - first <= ACCESS_SIDE_MAX; y++)
				access_add(s, sb + y * pitch, width, access, 0);
		}
		if (s->n - first > ACCESS_SIDE_MAX) {
			/* Too many pieces to keep: one bounding range. */
			s->n = first;
			access_add(s, base, (depth - 1) * slice + span, access, 0);
			return;
		}
	}
}

/* One operand of a 2D/3D copy. */
static void side(struct access_set *s, CUmemorytype type, CUdeviceptr dev, size_t x, size_t y, size_t z,
		 size_t pitch, size_t height_alloc, size_t width, size_t height, size_t depth, uint32_t access)
{
	/* A unified address may be host memory: the lookup at recording tells. */
	if (type != CU_MEMORYTYPE_DEVICE && type != CU_MEMORYTYPE_UNIFIED)
		return;
	if (!dev)
		return;
	pitched(s, dev + (z * height_alloc + y) * pitch + x, width, height, pitch, depth, pitch * height_alloc,
		access);
}

void access_copy2d(struct access_set *s, const CUDA_MEMCPY2D *c)
{
	side(s, c->srcMemoryType, c->srcDevice, c->srcXInBytes, c->srcY, 0, c->srcPitch, 0, c->WidthInBytes,
	     c->Height, 1, DAG_ACCESS_READ);
	side(s, c->dstMemoryType, c->dstDevice, c->dstXInBytes, c->dstY, 0, c->dstPitch, 0, c->WidthInBytes,
	     c->Height, 1, DAG_ACCESS_WRITE);
}

void access_copy3d(struct access_set *s, const CUDA_MEMCPY3D *c)
{
	side(s, c->srcMemoryType, c->srcDevice, c->srcXInBytes, c->srcY, c->srcZ, c->srcPitch, c->srcHeight,
	     c->WidthInBytes, c->Height, c->Depth, DAG_ACCESS_READ);
	side(s, c->dstMemoryType, c->dstDevice, c->dstXInBytes, c->dstY, c->dstZ, c->dstPitch, c->dstHeight,
	     c->WidthInBytes, c->Height, c->Depth, DAG_ACCESS_WRITE);
}

void access_copy3d_peer(struct access_set *s, const CUDA_MEMCPY3D_PEER *c)
{
	side(s, c->srcMemoryType, c->srcDevice, c->srcXInBytes, c->srcY, c->srcZ, c->srcPitch, c->srcHeight,
	     c->WidthInBytes, c->Height, c->Depth, DAG_ACCESS_READ);
	side(s, c->dstMemoryType, c->dstDevice, c->dstXInBytes, c->dstY, c->dstZ, c->dstPitch, c->dstHeight,
	     c->WidthInBytes, c->Height, c->Depth, DAG_ACCESS_WRITE);
}

void access_memset(struct access_set *s, CUdeviceptr dst, size_t pitch, size_t esize, size_t width,
		   size_t height)
{
	pitched(s, dst, width * esize, height, pitch, 1, 0, DAG_ACCESS_WRITE);
}
