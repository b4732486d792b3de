/* The shim's own counts of the calls that pass its launch, graph-launch,
 * copy and memset wrappers (counts.h), and gpucr_shim_counts(), which
 * hands them to the application (gpucr_shim.h). */
#include <string.h>

#include "counts.h"
#include "gpucr_shim.h"

struct shim_count_line shim_count_lines[SHIM_COUNT_LINES];

uint64_t shim_count_read(enum shim_count k)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < SHIM_COUNT_LINES; i++)
		sum += __atomic_load_n(&shim_count_lines[i].n[k], __ATOMIC_RELAXED);
	return sum;
}

/* Exported (gpucr-exports.list), not a driver symbol. */
SHIM_EXPORT int gpucr_shim_counts(struct gpucr_shim_counts *out, size_t size)
{
	struct gpucr_shim_counts c;

	if (!out)
		return -EINVAL;
	c.kernels = shim_count_read(SHIM_COUNT_KERNELS);
	c.graphs = shim_count_read(SHIM_COUNT_GRAPHS);
	c.copies = shim_count_read(SHIM_COUNT_COPIES);
	c.memsets = shim_count_read(SHIM_COUNT_MEMSETS);
	if (size > sizeof(c))
		size = sizeof(c);
	memcpy(out, &c, size);
	return (int)size;
}
