/* Suspects of a failed save epoch and the functions held in later ones:
 * the table of handles (unpredictable ones and the epoch's launches), their
 * names, the epoch's record and the held notices. See suspect.h. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "real.h"
#include "suspect.h"

#define SUSPECT_SLOTS 8192u /* a power of two, well above SUSPECT_MAX */

struct sentry {
	const void *h;        /* NULL: a free slot */
	uint8_t kind;         /* enum suspect_kind */
	bool unpredictable;
	uint32_t noted_cut;   /* the cut it was last noted in */
	uint32_t held_cut;    /* the cut its held notice was queued for */
	char *name;           /* the driver's, copied; NULL: none */
};

struct held {
	uint8_t kind;
	const void *h;
	const char *name; /* an unpredictable entry's: never freed */
};

static struct {
	pthread_mutex_t lock;
	struct sentry *tab;     /* SUSPECT_SLOTS, from the first note on */
	uint32_t *order;        /* slots noted since the cut, in order */
	uint32_t count;         /* entries in tab */
	uint32_t norder;
	uint32_t unpredictable; /* read without the lock by suspect_hold */
	uint32_t cut;           /* the current cut's number */
	int noting;             /* read without the lock by suspect_note */
	bool incomplete;        /* a launch since the cut could not be noted */
	bool lost;
	struct held held[SUSPECT_HELD_MAX];
	uint32_t nheld;
} sp = { .lock = PTHREAD_MUTEX_INITIALIZER, .cut = 1 };

static inline size_t slot_hash(uint8_t kind, const void *h)
{
	uint64_t v = ((uint64_t)(uintptr_t)h ^ kind) * 0x9e3779b97f4a7c15ull;

	return (size_t)(v >> 40) & (SUSPECT_SLOTS - 1);
}

/* The slot of (kind, h), or the free slot where it would go; -1 when the
 * table is missing. Under sp.lock. */
static long slot_find(uint8_t kind, const void *h)
{
	size_t i = slot_hash(kind, h);

	if (!sp.tab)
		return -1;
	for (size_t n = 0; n < SUSPECT_SLOTS; n++, i = (i + 1) & (SUSPECT_SLOTS - 1))
		if (!sp.tab[i].h || (sp.tab[i].h == h && sp.tab[i].kind == kind))
			return (long)i;
	return -1; /* never: count stays below SUSPECT_SLOTS */
}

static bool table_ready(void)
{
	if (sp.tab)
		return true;
	sp.tab = calloc(SUSPECT_SLOTS, sizeof(*sp.tab));
	sp.order = calloc(SUSPECT_MAX, sizeof(*sp.order));
	if (!sp.tab || !sp.order) {
		free(sp.tab);
		free(sp.order);
		sp.tab = NULL;
		sp.order = NULL;
		return false;
	}
	return true;
}

/* The driver's name of h, copied (non-printable bytes as '?'), or NULL. */
static char *name_of(uint8_t kind, const void *h)
{
	const char *s = NULL;
	char *copy;
	size_t n;
	CUresult r;

	if (kind != SUSPECT_FUNC)
		return NULL;
	real_ensure();
	if (!real.cuFuncGetName)
		r = CUDA_ERROR_INVALID_HANDLE;
	else
		r = real.cuFuncGetName(&s, (CUfunction)h);
	/* A CUkernel may be launched as a CUfunction. */
	if (r == CUDA_ERROR_INVALID_HANDLE && real.cuKernelGetName)
		r = real.cuKernelGetName(&s, (CUkernel)h);
	if (r != CUDA_SUCCESS || !s || !*s)
		return NULL;
	n = strnlen(s, SUSPECT_NAME_MAX - 1);
	copy = malloc(n + 1);
	if (!copy)
		return NULL;
	for (size_t i = 0; i < n; i++)
		copy[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
	copy[n] = '\0';
	return copy;
}

static void label(char *buf, uint8_t kind, const void *h, const char *name)
{
	if (name)
		snprintf(buf, SUSPECT_NAME_MAX, "%s", name);
	else
		snprintf(buf, SUSPECT_NAME_MAX, "%s %p", kind == SUSPECT_GRAPH ? "graph" : "function", h);
}

/* Under sp.lock: (kind, h) was let go in the epoch of this cut. */
static void note_slot(long i)
{
	struct sentry *e = &sp.tab[i];

	if (e->noted_cut == sp.cut)
		return;
	e->noted_cut = sp.cut;
	sp.order[sp.norder++] = (uint32_t)i; /* at most one per entry: count <= SUSPECT_MAX */
}

/* ---- the epoch --------------------------------------------------------------- */

/* Keeps only the unpredictable entries: the table holds those and one
 * epoch's launches, not every function ever launched in an epoch. */
static void table_compact(void)
{
	struct sentry *old = sp.tab, *nt;

	if (!old || sp.count == sp.unpredictable)
		return;
	nt = calloc(SUSPECT_SLOTS, sizeof(*nt));
	if (!nt)
		return; /* stale entries stay: only room is lost */
	sp.tab = nt;
	sp.count = 0;
	for (size_t i = 0; i < SUSPECT_SLOTS; i++) {
		long at;

		if (!old[i].h)
			continue;
		if (!old[i].unpredictable) {
			free(old[i].name);
			continue;
		}
		at = slot_find(old[i].kind, old[i].h);
		sp.tab[at] = old[i];
		sp.count++;
	}
	free(old);
}

void suspect_cut(void)
{
	pthread_mutex_lock(&sp.lock);
	__atomic_store_n(&sp.noting, 0, __ATOMIC_RELEASE);
	sp.cut++;
	sp.norder = 0;
	sp.incomplete = false;
	sp.nheld = 0;
	table_compact();
	pthread_mutex_unlock(&sp.lock);
}

void suspect_epoch_begin(void)
{
	pthread_mutex_lock(&sp.lock);
	__atomic_store_n(&sp.noting, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&sp.lock);
}

void suspect_epoch_end(void)
{
	pthread_mutex_lock(&sp.lock);
	__atomic_store_n(&sp.noting, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&sp.lock);
}

/* ---- the launches ------------------------------------------------------------- */

bool suspect_hold(enum suspect_kind kind, const void *h, bool waits)
{
	bool hold = false;
	long i;

	if (!h || !__atomic_load_n(&sp.unpredictable, __ATOMIC_ACQUIRE))
		return false;
	pthread_mutex_lock(&sp.lock);
	i = slot_find((uint8_t)kind, h);
	if (i >= 0 && sp.tab[i].h && sp.tab[i].unpredictable) {
		struct sentry *e = &sp.tab[i];

		hold = true;
		if (waits && e->held_cut != sp.cut && sp.nheld < SUSPECT_HELD_MAX) {
			e->held_cut = sp.cut;
			sp.held[sp.nheld++] = (struct held){ e->kind, e->h, e->name };
		}
	}
	pthread_mutex_unlock(&sp.lock);
	return hold;
}

void suspect_note(enum suspect_kind kind, const void *h)
{
	int saved = errno;
	char *name;
	long i;

	if (!h || !__atomic_load_n(&sp.noting, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&sp.lock);
	if (!sp.noting)
		goto out;
	if (!table_ready()) {
		sp.incomplete = true;
		goto out;
	}
	i = slot_find((uint8_t)kind, h);
	if (sp.tab[i].h) {
		note_slot(i);
		goto out;
	}
	/* First sight: the name, from the driver, with no lock held. */
	pthread_mutex_unlock(&sp.lock);
	name = name_of((uint8_t)kind, h);
	pthread_mutex_lock(&sp.lock);
	/* Stopped meanwhile: this call has not reached the driver yet, so its
	 * work comes after the epoch (or its escape) was settled. */
	if (!sp.noting) {
		free(name);
		goto out;
	}
	i = slot_find((uint8_t)kind, h);
	if (!sp.tab[i].h) {
		if (sp.count >= SUSPECT_MAX) {
			sp.incomplete = true;
			free(name);
			goto out;
		}
		sp.tab[i] = (struct sentry){ .h = h, .kind = (uint8_t)kind, .name = name };
		sp.count++;
	} else {
		free(name);
	}
	note_slot(i);
out:
	pthread_mutex_unlock(&sp.lock);
	errno = saved;
}

size_t suspect_escaped(struct suspect_report *ret)
{
	size_t n;

	memset(ret, 0, offsetof(struct suspect_report, name));
	pthread_mutex_lock(&sp.lock);
	__atomic_store_n(&sp.noting, 0, __ATOMIC_RELEASE);
	n = sp.norder;
	for (size_t k = 0; k < n; k++) {
		struct sentry *e = &sp.tab[sp.order[k]];

		if (!e->unpredictable) {
			e->unpredictable = true;
			__atomic_store_n(&sp.unpredictable, sp.unpredictable + 1, __ATOMIC_RELEASE);
		}
		if (ret->n < SUSPECT_REPORT_MAX)
			label(ret->name[ret->n++], e->kind, e->h, e->name);
	}
	ret->more = (uint32_t)(n - ret->n);
	ret->incomplete = sp.incomplete;
	/* Holding these launches is not enough when some could not be noted,
	 * or when none was let go (the write came from elsewhere). */
	if (sp.incomplete || !n)
		sp.lost = true;
	pthread_mutex_unlock(&sp.lock);
	return n;
}

size_t suspect_take_held(char (*ret)[SUSPECT_NAME_MAX], size_t max)
{
	size_t n;

	pthread_mutex_lock(&sp.lock);
	n = sp.nheld < max ? sp.nheld : max;
	for (size_t k = 0; k < n; k++)
		label(ret[k], sp.held[k].kind, sp.held[k].h, sp.held[k].name);
	memmove(sp.held, sp.held + n, (sp.nheld - n) * sizeof(*sp.held));
	sp.nheld -= (uint32_t)n;
	pthread_mutex_unlock(&sp.lock);
	return n;
}

void suspect_get_stats(struct suspect_stats *ret)
{
	pthread_mutex_lock(&sp.lock);
	ret->unpredictable = sp.unpredictable;
	ret->noted = sp.norder;
	ret->lost = sp.lost;
	pthread_mutex_unlock(&sp.lock);
}

void suspect_reset_after_fork(void)
{
	/* Only the forking thread lives on: the lock may have been held by
	 * another. The child has no epoch of its own yet. */
	pthread_mutex_init(&sp.lock, NULL);
	sp.noting = 0;
	sp.norder = 0;
	sp.nheld = 0;
	sp.incomplete = false;
}

void suspect_reset(void)
{
	pthread_mutex_lock(&sp.lock);
	if (sp.tab)
		for (size_t i = 0; i < SUSPECT_SLOTS; i++)
			free(sp.tab[i].name);
	free(sp.tab);
	free(sp.order);
	sp.tab = NULL;
	sp.order = NULL;
	sp.count = sp.norder = sp.nheld = 0;
	__atomic_store_n(&sp.unpredictable, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&sp.noting, 0, __ATOMIC_RELEASE);
	sp.cut++;
	sp.incomplete = sp.lost = false;
	pthread_mutex_unlock(&sp.lock);
}
