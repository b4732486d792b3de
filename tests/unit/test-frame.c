/* Frames over a socketpair: round trip with fds, split and partial reads,
 * clean EOF, truncated and oversized frames, too many fds. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frame.h"
#include "t.h"

static void pair(int sv[2])
{
	REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
}

static int same_file(int a, int b)
{
	struct stat sa, sb;

	return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
	       sa.st_ino == sb.st_ino;
}

static void test_round_trip_with_fds(void)
{
	int sv[2], fds[3], got[8];
	unsigned nfds = 0, i;
	char payload[10000];
	void *buf = NULL;
	size_t len = 0;

	pair(sv);
	for (i = 0; i < sizeof(payload); i++)
		payload[i] = (char)(i * 7);
	for (i = 0; i < 3; i++)
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	CHECK_EQ_INT(frame_send(sv[0], payload, sizeof(payload), fds, 3), 0);
	CHECK_EQ_INT(frame_send(sv[0], "x", 1, NULL, 0), 0);
	CHECK_EQ_INT(frame_recv(sv[1], &buf, &len, got, 8, &nfds), 0);
	CHECK_EQ_INT(len, sizeof(payload));
	CHECK(buf && memcmp(buf, payload, sizeof(payload)) == 0);
	CHECK_EQ_INT(nfds, 3);
	for (i = 0; i < nfds && i < 3; i++) {
		CHECK(got[i] != fds[i]);
		CHECK(same_file(got[i], fds[i]));
		CHECK((fcntl(got[i], F_GETFD) & FD_CLOEXEC) != 0);
		close(got[i]);
	}
	free(buf);
	/* The second frame arrives alone, without the first one's fds. */
	CHECK_EQ_INT(frame_recv(sv[1], &buf, &len, got, 8, &nfds), 0);
	CHECK_EQ_INT(len, 1);
	CHECK_EQ_INT(nfds, 0);
	free(buf);
	for (i = 0; i < 3; i++)
		close(fds[i]);
	close(sv[0]);
	/* Clean EOF between frames. */
	CHECK_EQ_INT(frame_recv(sv[1], &buf, &len, got, 8, &nfds), -EPIPE);
	close(sv[1]);
}

static void test_empty_frame(void)
{
	int sv[2];
	void *buf = (void *)1;
	size_t len = 99;

	pair(sv);
	CHECK_EQ_INT(frame_send(sv[0], NULL, 0, NULL, 0), 0);
	CHECK_EQ_INT(frame_recv(sv[1], &buf, &len, NULL, 0, NULL), 0);
	CHECK_EQ_INT(len, 0);
	CHECK(buf == NULL);
	close(sv[0]);
	close(sv[1]);
}

/* A frame delivered a byte at a time to a non-blocking reader. */
static void test_partial_nonblocking(void)
{
	uint8_t raw[4 + 5] = { 5, 0, 0, 0, 'h', 'e', 'l', 'l', 'o' };
	struct frame_rx rx;
	unsigned i, nfds;
	void *buf;
	size_t len;
	int sv[2], r = 0;

	pair(sv);
	REQUIRE(fcntl(sv[1], F_SETFL, O_NONBLOCK) == 0);
	frame_rx_init(&rx);
	CHECK_EQ_INT(frame_rx_read(&rx, sv[1]), -EAGAIN);
	for (i = 0; i < sizeof(raw); i++) {
		REQUIRE(write(sv[0], raw + i, 1) == 1);
		r = frame_rx_read(&rx, sv[1]);
		if (i + 1 < sizeof(raw))
			CHECK_EQ_INT(r, -EAGAIN);
	}
	CHECK_EQ_INT(r, 1);
	CHECK_EQ_INT(frame_rx_take(&rx, &buf, &len, NULL, 0, &nfds), 0);
	CHECK_EQ_INT(len, 5);
	CHECK(buf && memcmp(buf, "hello", 5) == 0);
	free(buf);
	frame_rx_free(&rx);
	close(sv[0]);
	close(sv[1]);
}

static void test_truncated(void)
{
	uint8_t raw[4 + 3] = { 100, 0, 0, 0, 'a', 'b', 'c' };
	void *buf = NULL;
	size_t len;
	int sv[2];

	/* Peer dies in the middle of the payload. */
	pair(sv);
	REQUIRE(write(sv[0], raw, sizeof(raw)) == (ssize_t)sizeof(raw));
	close(sv[0]);
	CHECK_EQ_INT(frame_recv(sv[1], &buf, &len, NULL, 0, NULL), -EPROTO);
	CHECK(buf == NULL);
	close(sv[1]);

	/* ... or in the middle of the length. */
	pair(sv);
	REQUIRE(write(sv[0], raw, 2) == 2);
	close(sv[0]);
	CHECK_EQ_INT(frame_recv(sv[1], &buf, &len, NULL, 0, NULL), -EPROTO);
	close(sv[1]);
}

static void test_oversized(void)
{
	uint8_t raw[4] = { 0xff, 0xff, 0xff, 0x7f };
	void *buf = NULL;
	size_t len;
	int sv[2];

	pair(sv);
	REQUIRE(write(sv[0], raw, sizeof(raw)) == 4);
	CHECK_EQ_INT(frame_recv(sv[1], &buf, &len, NULL, 0, NULL), -EPROTO);
	CHECK(buf == NULL);
	CHECK_EQ_INT(frame_send(sv[0], raw, (size_t)FRAME_MAX + 1, NULL, 0), -EMSGSIZE);
	close(sv[0]);
	close(sv[1]);
}

static int count_open_fds(void)
{
	int n = 0, fd;

	for (fd = 0; fd < 1024; fd++)
		if (fcntl(fd, F_GETFD) >= 0)
			n++;
	return n;
}

/* More fds than the receiver accepts: the frame is dropped, the fds closed. */
static void test_too_many_fds(void)
{
	int sv[2], fds[4], got[2], before;
	void *buf = NULL;
	size_t len;
	unsigned nfds, i;

	pair(sv);
	for (i = 0; i < 4; i++)
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	before = count_open_fds();
	CHECK_EQ_INT(frame_send(sv[0], "abc", 3, fds, 4), 0);
	CHECK_EQ_INT(frame_recv(sv[1], &buf, &len, got, 2, &nfds), -EPROTO);
	CHECK_EQ_INT(count_open_fds(), before);
	for (i = 0; i < 4; i++)
		close(fds[i]);
	close(sv[0]);
	close(sv[1]);
}

int main(void)
{
	test_round_trip_with_fds();
	test_empty_frame();
	test_partial_nonblocking();
	test_truncated();
	test_oversized();
	test_too_many_fds();
	return t_done();
}
