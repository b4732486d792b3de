/* A CPU-only C/R test program: counts, writing "<count> <checksum>\n" to the
 * file named by argv[1] every 20 ms, with its state in a heap buffer so a
 * restore that lost memory shows up as a checksum mismatch. Exits 0 when it
 * reaches argv[2] (default: never). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	const size_t n = 1 << 20;
	uint64_t *state = malloc(n * sizeof(*state)), count = 0, sum, i;
	long limit = argc > 2 ? atol(argv[2]) : -1;
	struct timespec ts = { 0, 20 * 1000 * 1000 };
	char tmp[4096];

	if (argc < 2 || !state)
		return 2;
	for (i = 0; i < n; i++)
		state[i] = i;
	for (;;) {
		FILE *f;

		for (i = 0, sum = 0; i < n; i++) {
			state[i] = state[i] * 6364136223846793005ull + 1442695040888963407ull;
			sum += state[i];
		}
		count++;
		/* Written aside and renamed: a reader never sees the file empty. */
		snprintf(tmp, sizeof(tmp), "%s.tmp", argv[1]);
		f = fopen(tmp, "w");
		if (f) {
			fprintf(f, "%llu %llu\n", (unsigned long long)count, (unsigned long long)sum);
			if (fclose(f) == 0)
				rename(tmp, argv[1]);
		}
		if (limit >= 0 && (long)count >= limit) {
			free(state);
			return 0;
		}
		nanosleep(&ts, NULL);
	}
}
