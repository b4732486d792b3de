/* Protocol messages: round trip with fds, fd count mismatches, and garbage
 * bytes (random and mutated real messages) that must decode to -EBADMSG or a
 * valid message, never a crash. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"
#include "msg.h"
#include "t.h"

static void test_round_trip(void)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *got = NULL;
	Gpucr__BufferAdd ba = GPUCR__BUFFER_ADD__INIT;
	int sv[2], fd, rfd[4];
	unsigned nfds = 0;

	REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	ba.va = 0x7f0000200000ull;
	ba.size = 3u << 20;
	ba.device = 1;
	m.has_id = 1;
	m.id = 42;
	m.body_case = GPUCR__MSG__BODY_BUFFER_ADD;
	m.buffer_add = &ba;
	fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	CHECK_EQ_INT(msg_send(sv[0], &m, &fd, 1), 0);
	CHECK_EQ_INT(msg_recv(sv[1], &got, rfd, 4, &nfds), 0);
	REQUIRE(got);
	CHECK_EQ_INT(nfds, 1);
	CHECK_EQ_INT(got->id, 42);
	CHECK_EQ_INT(got->body_case, GPUCR__MSG__BODY_BUFFER_ADD);
	CHECK_EQ_INT(got->buffer_add->va, 0x7f0000200000ull);
	CHECK_EQ_INT(got->buffer_add->size, 3u << 20);
	CHECK(strcmp(msg_body_name(got), "buffer_add") == 0);
	msg_free(got);
	close(rfd[0]);
	close(fd);
	close(sv[0]);
	close(sv[1]);
}

/* A message that announces fds it did not bring is refused. */
static void test_fd_mismatch(void)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *got = NULL;
	uint8_t buf[64];
	size_t len;

	m.has_nfds = 1;
	m.nfds = 2;
	len = gpucr__msg__pack(&m, buf);
	CHECK_EQ_INT(msg_decode(buf, len, 0, &got), -EBADMSG);
	CHECK_EQ_INT(msg_decode(buf, len, 2, &got), 0);
	msg_free(got);
}

static uint64_t rng = 0x12345678;

static uint32_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)rng;
}

static void test_garbage(void)
{
	Gpucr__Msg m = GPUCR__MSG__INIT, *got;
	Gpucr__DumpRequest d = GPUCR__DUMP_REQUEST__INIT;
	uint8_t good[256], buf[256];
	size_t glen, len, i;
	int k, bad = 0, ok = 0;

	d.pid = 1234;
	d.has_leave_running = 1;
	d.leave_running = 1;
	m.has_id = 1;
	m.id = 7;
	m.body_case = GPUCR__MSG__BODY_DUMP;
	m.dump = &d;
	glen = gpucr__msg__pack(&m, good);

	for (k = 0; k < 20000; k++) {
		if (k & 1) {
			len = next() % sizeof(buf);
			for (i = 0; i < len; i++)
				buf[i] = (uint8_t)next();
		} else {
			memcpy(buf, good, glen);
			len = glen - (next() % 3 == 0 ? next() % glen : 0);
			for (i = 0; i < 1 + next() % 4; i++)
				buf[next() % glen] ^= (uint8_t)(1u << (next() % 8));
		}
		got = NULL;
		if (msg_decode(buf, len, 0, &got) == 0) {
			ok++;
			(void)msg_body_name(got);
			msg_free(got);
		} else {
			bad++;
		}
	}
	/* Both outcomes must occur, or the mutation did nothing. */
	CHECK(bad > 0);
	CHECK(ok > 0);
}

/* Garbage on a socket: the receiver reports an error and survives. */
static void test_garbage_on_socket(void)
{
	uint8_t junk[] = { 6, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
	Gpucr__Msg *got = NULL;
	int sv[2], fds[2];

	REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	REQUIRE(write(sv[0], junk, sizeof(junk)) == (ssize_t)sizeof(junk));
	CHECK_EQ_INT(msg_recv(sv[1], &got, fds, 2, NULL), -EBADMSG);
	CHECK(got == NULL);
	close(sv[0]);
	close(sv[1]);
}

int main(void)
{
	test_round_trip();
	test_fd_mismatch();
	test_garbage();
	test_garbage_on_socket();
	return t_done();
}
