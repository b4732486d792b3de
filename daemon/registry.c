/* Owns the registry of attached processes: who they are (pid and uid from
 * SO_PEERCRED), their state, and the exported memory (fds) they handed over. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpucrd.h"
#include "log.h"

struct proc *registry_find(struct daemon *d, pid_t pid)
{
	struct proc *p;

	for (p = d->procs; p; p = p->next)
		if (p->pid == pid)
			return p;
	return NULL;
}

struct proc *registry_attach(struct daemon *d, pid_t pid, uid_t uid, const char *comm)
{
	struct proc *p = registry_find(d, pid);

	if (p && p->uid != uid) {
		/* A new process reusing the pid of a gone one whose memory was
		 * retained for another user: never hand that memory over. */
		registry_drop(d, p);
		p = NULL;
	}
	if (!p) {
		p = calloc(1, sizeof(*p));
		if (!p)
			return NULL;
		p->pid = pid;
		p->uid = uid;
		p->next = d->procs;
		d->procs = p;
	}
	if (comm)
		snprintf(p->comm, sizeof(p->comm), "%s", comm);
	p->state = GPUCR__PROC_STATE__PROC_RUNNING;
	return p;
}

int registry_buffer_add(struct proc *p, const Gpucr__BufferAdd *ba, int fd)
{
	struct rbuf *b, **pp;

	for (pp = &p->bufs; *pp; pp = &(*pp)->next)
		if ((*pp)->va == ba->va && (*pp)->phys_offset == (ba->has_phys_offset ? ba->phys_offset : 0))
			return -EEXIST;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->va = ba->va;
	b->size = ba->size;
	b->device = ba->device;
	b->phys_size = ba->has_phys_size ? ba->phys_size : ba->size;
	b->phys_offset = ba->has_phys_offset ? ba->phys_offset : 0;
	b->kind = ba->has_kind ? (int)ba->kind : 0;
	b->fd = fd;
	b->next = p->bufs;
	p->bufs = b;
	p->nbufs++;
	p->bytes += b->phys_size;
	return 0;
}

int registry_buffer_free(struct proc *p, uint64_t va)
{
	struct rbuf **pp = &p->bufs, *b;
	int found = 0;

	while ((b = *pp)) {
		if (b->va != va) {
			pp = &b->next;
			continue;
		}
		*pp = b->next;
		p->nbufs--;
		p->bytes -= b->phys_size;
		if (b->fd >= 0)
			close(b->fd);
		free(b);
		found = 1;
	}
	return found ? 0 : -ENOENT;
}

void registry_drop(struct daemon *d, struct proc *p)
{
	struct proc **pp;
	struct rbuf *b;

	for (pp = &d->procs; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	while ((b = p->bufs)) {
		p->bufs = b->next;
		if (b->fd >= 0)
			close(b->fd);
		free(b);
	}
	free(p);
}

void registry_detach(struct daemon *d, struct proc *p)
{
	p->shim = NULL;
	if (p->state == GPUCR__PROC_STATE__PROC_DUMPED || p->state == GPUCR__PROC_STATE__PROC_RELEASED) {
		pr_info("pid %d (%s): detached; keeping %llu bytes of GPU memory for its restore",
			(int)p->pid, p->comm, (unsigned long long)p->bytes);
		return;
	}
	pr_debug("pid %d (%s): detached", (int)p->pid, p->comm);
	registry_drop(d, p);
}

void registry_free_all(struct daemon *d)
{
	while (d->procs)
		registry_drop(d, d->procs);
}
