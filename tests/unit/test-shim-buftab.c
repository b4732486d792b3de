/* The buffer table: lookup by any address inside an entry, exact-base
 * removal, overlap rules (owned entries never overlap; stale driver entries
 * give way), iteration in address order, per-kind counts, unique ids; and a
 * randomised run checked against a plain list. No driver needed. */
#include <stdio.h>
#include <stdlib.h>

#include "buftab.h"
#include "t.h"

#define N 2000

static int visit(const struct buf *b, void *arg)
{
	CUdeviceptr *last = arg;

	if (b->base <= *last && *last)
		return -1;
	*last = b->base;
	return 0;
}

static struct buf mk(CUdeviceptr base, size_t size, enum buf_kind kind)
{
	return (struct buf){ .base = base, .size = size, .id = buftab_new_id(), .kind = kind };
}

int main(void)
{
	static struct buf model[N];
	static int live[N];
	struct buf b, e;
	CUdeviceptr last = 0;
	int i, k, errs = 0;

	/* Basics. */
	b = mk(0x10000, 0x100, BUF_VMM);
	CHECK_EQ_INT(buftab_insert(&b), 0);
	CHECK_EQ_INT(buftab_lookup(0x10000, &e), 0);
	CHECK_EQ_INT(e.id, b.id);
	CHECK_EQ_INT(buftab_lookup(0x100ff, &e), 0);
	CHECK_EQ_INT(buftab_lookup(0x10100, &e), -ENOENT);
	CHECK_EQ_INT(buftab_lookup(0xffff, &e), -ENOENT);
	CHECK(b.id >> 63);
	e = mk(0x10080, 0x100, BUF_SUB);
	CHECK_EQ_INT(buftab_insert(&e), -EEXIST);
	e = mk(0x0ff00, 0x101, BUF_DRIVER);
	CHECK_EQ_INT(buftab_insert(&e), -EEXIST);
	e = mk(0x20000, 0, BUF_VMM);
	CHECK_EQ_INT(buftab_insert(&e), -EINVAL);
	CHECK_EQ_INT(buftab_remove(0x10001, NULL), -ENOENT);
	CHECK_EQ_INT(buftab_remove(0x10000, &e), 0);
	CHECK_EQ_INT(e.size, 0x100);
	CHECK_EQ_INT(buftab_lookup(0x10000, NULL), -ENOENT);

	/* Stale driver entries give way to new ones at their addresses. */
	b = mk(0x30000, 0x1000, BUF_DRIVER);
	CHECK_EQ_INT(buftab_insert(&b), 0);
	b = mk(0x31000, 0x1000, BUF_MANAGED);
	CHECK_EQ_INT(buftab_insert(&b), 0);
	CHECK_EQ_INT(buftab_count(BUF_MANAGED), 1);
	b = mk(0x30800, 0x1000, BUF_DRIVER);
	CHECK_EQ_INT(buftab_insert(&b), 0);
	CHECK_EQ_INT(buftab_count(BUF_DRIVER), 1);
	CHECK_EQ_INT(buftab_count(BUF_MANAGED), 0);
	CHECK_EQ_INT(buftab_lookup(0x30000, NULL), -ENOENT);
	CHECK_EQ_INT(buftab_remove(0x30800, NULL), 0);

	/* Random inserts and removes against a model. */
	srand(42);
	for (i = 0; i < N; i++)
		model[i] = mk(0x100000000ULL + (CUdeviceptr)i * 0x10000, 1 + rand() % 0x10000,
			      (enum buf_kind)(BUF_VMM + rand() % 2));
	for (k = 0; k < 5 * N; k++) {
		i = rand() % N;
		if (live[i]) {
			if (buftab_remove(model[i].base, &e) != 0 || e.id != model[i].id)
				errs++;
			live[i] = 0;
		} else {
			if (buftab_insert(&model[i]) != 0)
				errs++;
			live[i] = 1;
		}
		if (k % 97 == 0) {
			CUdeviceptr a = model[i].base + (CUdeviceptr)(rand() % 0x10000);
			int found = buftab_lookup(a, &e) == 0;
			int want = live[i] && a < model[i].base + model[i].size;

			if (found != want || (found && e.id != model[i].id))
				errs++;
		}
	}
	CHECK_EQ_INT(errs, 0);
	for (i = 0, k = 0; i < N; i++)
		k += live[i];
	CHECK_EQ_INT(buftab_count(BUF_VMM) + buftab_count(BUF_SUB), k);
	CHECK_EQ_INT(buftab_for_each(visit, &last), 0);
	for (i = 0; i < N; i++)
		if (live[i])
			CHECK_EQ_INT(buftab_remove(model[i].base, NULL), 0);
	CHECK_EQ_INT(buftab_count(BUF_VMM) + buftab_count(BUF_SUB), 0);
	return t_done();
}
