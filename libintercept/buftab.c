/* The buffer table: a sorted array of entries, binary-searched under a
 * rwlock. Allocations mostly arrive at rising addresses, so inserts are
 * mostly appends; removal shifts the tail. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "buftab.h"

static pthread_rwlock_t buftab_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct buf *tab;
static size_t ntab, captab;
static size_t nkind[BUF_KIND_MAX + 1];
static uint64_t next_id;

uint64_t buftab_new_id(void)
{
	return (1ULL << 63) | (__atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED));
}

/* Index of the first entry with base > addr; under the lock. */
static size_t upper(CUdeviceptr addr)
{
	size_t lo = 0, hi = ntab;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (tab[mid].base <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void drop_at(size_t i)
{
	nkind[tab[i].kind]--;
	memmove(&tab[i], &tab[i + 1], (ntab - i - 1) * sizeof(*tab));
	ntab--;
}

int buftab_insert(const struct buf *b)
{
	CUdeviceptr end = b->base + b->size;
	size_t i;
	int ret = 0;

	if (!b->size || b->kind < BUF_VMM || b->kind > BUF_KIND_MAX || end < b->base)
		return -EINVAL;
	pthread_rwlock_wrlock(&buftab_lock);
	i = upper(b->base);
	/* Overlaps: the entry before (if it reaches past base) and those after
	 * that start before end. Held ones are a bug; others are stale. */
	if (i > 0 && tab[i - 1].base + tab[i - 1].size > b->base) {
		if (buf_held(&tab[i - 1]) || buf_held(b)) {
			ret = -EEXIST;
			goto out;
		}
		drop_at(--i);
	}
	while (i < ntab && tab[i].base < end) {
		if (buf_held(&tab[i]) || buf_held(b)) {
			ret = -EEXIST;
			goto out;
		}
		drop_at(i);
	}
	if (ntab == captab) {
		size_t ncap = captab ? captab * 2 : 256;
		struct buf *n = realloc(tab, ncap * sizeof(*tab));

		if (!n) {
			ret = -ENOMEM;
			goto out;
		}
		tab = n;
		captab = ncap;
	}
	memmove(&tab[i + 1], &tab[i], (ntab - i) * sizeof(*tab));
	tab[i] = *b;
	ntab++;
	nkind[b->kind]++;
out:
	pthread_rwlock_unlock(&buftab_lock);
	return ret;
}

int buftab_remove(CUdeviceptr base, struct buf *ret_buf)
{
	size_t i;
	int ret = -ENOENT;

	pthread_rwlock_wrlock(&buftab_lock);
	i = upper(base);
	if (i > 0 && tab[i - 1].base == base) {
		if (ret_buf)
			*ret_buf = tab[i - 1];
		drop_at(i - 1);
		ret = 0;
	}
	pthread_rwlock_unlock(&buftab_lock);
	return ret;
}

int buftab_lookup(CUdeviceptr addr, struct buf *ret_buf)
{
	size_t i;
	int ret = -ENOENT;

	pthread_rwlock_rdlock(&buftab_lock);
	i = upper(addr);
	if (i > 0 && addr - tab[i - 1].base < tab[i - 1].size) {
		if (ret_buf)
			*ret_buf = tab[i - 1];
		ret = 0;
	}
	pthread_rwlock_unlock(&buftab_lock);
	return ret;
}

int buftab_for_each(int (*fn)(const struct buf *b, void *arg), void *arg)
{
	size_t i;
	int ret = 0;

	pthread_rwlock_rdlock(&buftab_lock);
	for (i = 0; i < ntab && !ret; i++)
		ret = fn(&tab[i], arg);
	pthread_rwlock_unlock(&buftab_lock);
	return ret;
}

size_t buftab_count(enum buf_kind kind)
{
	size_t n;

	if (kind < BUF_VMM || kind > BUF_KIND_MAX)
		return 0;
	pthread_rwlock_rdlock(&buftab_lock);
	n = nkind[kind];
	pthread_rwlock_unlock(&buftab_lock);
	return n;
}
