/* The buffer table: every device allocation the application holds, as it
 * asked for it, found by address in O(log n).
 *
 * An entry describes one application allocation (one cuMemAlloc, one
 * sub-allocation of a slab, one managed allocation), not the physical
 * memory behind it: that is alloc.c's region, which an entry points to.
 * Entries are copied in and out; nothing returned points into the table, so
 * no lock is held by a caller. Thread-safe (a rwlock: lookups share it). */
#ifndef GPUCR_BUFTAB_H
#define GPUCR_BUFTAB_H

#include "shim.h"

enum buf_kind {
	BUF_VMM = 1, /* gpucr's: VMM memory of its own region */
	BUF_SUB,     /* gpucr's: part of a slab region (small request) */
	BUF_DRIVER,  /* the driver's (VMM unusable there): its checkpoint saves it */
	BUF_MANAGED, /* cuMemAllocManaged, passed through; a dump must be refused */
	BUF_APP,     /* the application's own VMM mapping (cuMemCreate + cuMemMap), adopted
		      * by gpucr (appvmm.h): gpucr saves, releases and remaps it, the
		      * driver answers queries about it as for any mapping */
};
#define BUF_KIND_MAX BUF_APP

/* Allocated stream-ordered (cuMemAllocAsync / FromPoolAsync). */
#define BUF_F_ASYNC 0x1u

struct region; /* alloc.c */

struct buf {
	CUdeviceptr base;
	size_t size;            /* bytes the application asked for (pitch * height if pitched) */
	uint64_t id;            /* unique per allocation in this process */
	struct region *region;  /* BUF_VMM, BUF_SUB, BUF_APP: backing memory (alloc.c owns it) */
	int device;             /* ordinal; -1 for managed memory */
	enum buf_kind kind;
	unsigned int flags;     /* BUF_F_* */
};

/* gpucr allocated it: gpucr answers for it (its extent, its id) and frees it. */
static inline bool buf_owned(const struct buf *b)
{
	return b->kind == BUF_VMM || b->kind == BUF_SUB;
}

/* Its memory is in gpucr's hands at a dump (the daemon holds, saves and
 * gives it back), whoever allocated it. */
static inline bool buf_held(const struct buf *b)
{
	return buf_owned(b) || b->kind == BUF_APP;
}

/* A new id for an allocation: process-unique, never 0, and with the top bit
 * set so that it cannot collide with the driver's own buffer ids. */
uint64_t buftab_new_id(void) SHIM_HIDDEN;

/* Adds b (size > 0). A held entry may not overlap another held one
 * (-EEXIST). Overlapped driver or managed entries are stale: the driver
 * freed them behind gpucr's back (a context was destroyed) and reused the
 * addresses, so they are dropped. -ENOMEM when the table cannot grow. */
int buftab_insert(const struct buf *b) SHIM_HIDDEN;

/* Removes the entry that starts exactly at base; its copy goes to ret_buf
 * (may be NULL). -ENOENT when no entry starts there. */
int buftab_remove(CUdeviceptr base, struct buf *ret_buf) SHIM_HIDDEN;

/* The entry containing addr (base <= addr < base + size), copied to
 * ret_buf. -ENOENT when none does. */
int buftab_lookup(CUdeviceptr addr, struct buf *ret_buf) SHIM_HIDDEN;

/* Calls fn for each entry in address order under the read lock; fn must not
 * call back into buftab_insert/remove. Stops at, and returns, the first
 * nonzero value fn returns; 0 when all were visited. */
int buftab_for_each(int (*fn)(const struct buf *b, void *arg), void *arg) SHIM_HIDDEN;

/* How many entries of that kind the table holds now. */
size_t buftab_count(enum buf_kind kind) SHIM_HIDDEN;

#endif
