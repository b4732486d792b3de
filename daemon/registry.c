/* Owns the registry of attached processes: who they are (pid and uid from
 * SO_PEERCRED), their state, and the exported memory (fds) they handed over. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
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
		p->state = GPUCR__PROC_STATE__PROC_RUNNING;
		p->next = d->procs;
		d->procs = p;
	}
	if (comm)
		snprintf(p->comm, sizeof(p->comm), "%s", comm);
	return p;
}

void rbuf_release(struct rbuf *b)
{
	gpu_mem_release(&b->mem);
	if (b->fd >= 0)
		close(b->fd);
	b->fd = -1;
}

void rbuf_free(struct rbuf *b)
{
	if (!b)
		return;
	rbuf_release(b);
	free(b);
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
	b->mem.fd = -1;
	if (ba->has_device_uuid && ba->device_uuid.len == 16)
		memcpy(b->uuid, ba->device_uuid.data, 16);
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
		rbuf_free(b);
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
	if (p->dump)
		dump_proc_gone(d, p);
	/* A running pre-copy's worker still uses it: only at gpucrd's exit,
	 * where it is left to the process's end. */
	if (!precopy_running(p))
		precopy_free(p->precopy);
	while ((b = p->bufs)) {
		p->bufs = b->next;
		rbuf_free(b);
	}
	free(p);
}

void registry_forget_conn(struct daemon *d, struct conn *c)
{
	struct proc *p;

	for (p = d->procs; p; p = p->next)
		if (p->cr_conn == c)
			p->cr_conn = NULL;
}

void registry_detach(struct daemon *d, struct proc *p)
{
	p->shim = NULL;
	if (registry_keeps(p)) {
		pr_info("pid %d (%s): detached; keeping %llu bytes of GPU memory for its restore",
			(int)p->pid, p->comm, (unsigned long long)p->bytes);
		dump_shim_detached(p);
		return;
	}
	if (p->dump)
		dump_proc_gone(d, p);
	pr_debug("pid %d (%s): detached", (int)p->pid, p->comm);
	if (p->busy) {
		/* A worker job still uses it; it drops the process when done. */
		p->state = GPUCR__PROC_STATE__PROC_GONE;
		return;
	}
	registry_drop(d, p);
}

int rbuf_import(struct rbuf *b, char *msg, size_t msglen)
{
	struct gpu_dev *dev = gpu_dev_by_uuid(b->uuid);
	int r;

	if (!dev)
		dev = gpu_dev_by_ordinal((int)b->device);
	if (!dev) {
		snprintf(msg, msglen, "buffer 0x%llx is on device %u, which gpucrd does not see",
			 (unsigned long long)b->va, b->device);
		return -ENODEV;
	}
	r = gpu_mem_import(dev, b->fd, b->phys_size, &b->mem);
	if (r < 0)
		snprintf(msg, msglen, "buffer 0x%llx (%llu bytes): import failed: %s", (unsigned long long)b->va,
			 (unsigned long long)b->phys_size, gpucr_strerror(r));
	return r;
}

int registry_take_over(struct proc *p, char *msg, size_t msglen)
{
	char gmsg[512];
	struct rbuf *b;
	int r;

	r = gpu_init(gmsg, sizeof(gmsg));
	if (r < 0) {
		snprintf(msg, msglen, "no GPU access in gpucrd: %.400s", gmsg);
		return r;
	}
	for (b = p->bufs; b; b = b->next) {
		if (b->mem.dev)
			continue;
		r = rbuf_import(b, gmsg, sizeof(gmsg));
		if (r < 0) {
			snprintf(msg, msglen, "pid %d: %s", (int)p->pid, gmsg);
			return r;
		}
	}
	return 0;
}

void registry_free_all(struct daemon *d)
{
	while (d->procs)
		registry_drop(d, d->procs);
}

static int droppable(const struct proc *p)
{
	return !p->shim && p->nbufs && p->image_done && !p->busy && !p->dump &&
	       p->state == GPUCR__PROC_STATE__PROC_DUMPED;
}

void registry_enforce_cap(struct daemon *d)
{
	for (;;) {
		struct proc *p, *oldest = NULL;
		uint64_t kept = 0;

		for (p = d->procs; p; p = p->next)
			if (!p->shim && p->nbufs) {
				kept += p->bytes;
				if (droppable(p) && (!oldest || p->t_dumped < oldest->t_dumped))
					oldest = p;
			}
		if (kept <= d->retain_max || !oldest)
			return;
		pr_info("pid %d (%s): freeing the %llu MiB of GPU memory kept for it (more than %llu MiB kept); "
			"its image in %s remains", (int)oldest->pid, oldest->comm,
			(unsigned long long)(oldest->bytes >> 20), (unsigned long long)(d->retain_max >> 20),
			oldest->image_dir);
		registry_drop(d, oldest);
	}
}
