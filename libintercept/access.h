/* Access sets: the device address ranges a copy or memset reads and writes,
 * decoded from its parameters, for the copy wrappers (copy.c) and the
 * graph nodes (graph.h). Decoding looks nothing up: dag_record_ranges()
 * finds the buffers (and drops host memory) only while an epoch is open.
 *
 * Pitched 2D/3D operands are exact at chunk granularity: each row is a
 * range, and two ranges whose gap is smaller than a chunk are merged (such
 * a gap cannot hold a whole chunk, wherever the chunk boundaries lie, so
 * the chunks the merged range covers are exactly those the rows touch). So
 * rows of a pitch less than a chunk beyond the width make one range per
 * slice, and the work per operand stays bounded by ACCESS_SIDE_MAX pieces;
 * an operand that would need more becomes one bounding range from its
 * first byte to its last (conservative: chunks between rows count too).
 * Merging uses the chunk size of the time of decoding; a smaller chunk
 * size configured later only makes the set larger than exact.
 *
 * Memory: a set starts with inline room and grows on the heap; the caller
 * owns it and frees it with access_free(). A set that could not grow is
 * marked unbounded (as an undecodable graph node is, graph.h). */
#ifndef GPUCR_ACCESS_H
#define GPUCR_ACCESS_H

#include "dag.h"
#include "shim.h"

#define ACCESS_INLINE 32
#define ACCESS_SIDE_MAX 256 /* pieces of one operand before it is bounded */

struct access_set {
	size_t n, cap;
	struct dag_range *r; /* inline_r, or heap memory */
	size_t chunk;        /* merge gaps below this (dag_chunk_size()) */
	bool unbounded;      /* an allocation failed: anything may be written */
	struct dag_range inline_r[ACCESS_INLINE];
};

void access_init(struct access_set *s) SHIM_HIDDEN;
/* Frees heap memory of s (NULL is fine) and empties it. */
void access_free(struct access_set *s) SHIM_HIDDEN;

/* [a, a + len) read or written (DAG_ACCESS_*); with DAG_RANGE_WHOLE, the
 * whole of every buffer it meets. Nothing for a == 0 or len == 0. */
void access_add(struct access_set *s, CUdeviceptr a, size_t len, uint32_t access, uint32_t flags) SHIM_HIDDEN;

/* Whole-buffer read+write ranges for the buffers a kernel's parameters
 * reach (launch_decode); false when the launch could not be decoded. */
bool access_kernel(struct access_set *s, CUfunction f, void **kernelParams, void **extra) SHIM_HIDDEN;

/* The operands of a copy: device and unified sides give ranges, host and
 * array sides none. */
void access_copy2d(struct access_set *s, const CUDA_MEMCPY2D *c) SHIM_HIDDEN;
void access_copy3d(struct access_set *s, const CUDA_MEMCPY3D *c) SHIM_HIDDEN;
void access_copy3d_peer(struct access_set *s, const CUDA_MEMCPY3D_PEER *c) SHIM_HIDDEN;

/* A memset of height rows of width elements of esize bytes, pitch apart. */
void access_memset(struct access_set *s, CUdeviceptr dst, size_t pitch, size_t esize, size_t width,
		   size_t height) SHIM_HIDDEN;

#endif
