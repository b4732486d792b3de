/* Pointer attributes: cuPointerGetAttribute and cuPointerGetAttributes.
 *
 * The driver answers for gpucr's memory as for any VMM mapping, which is
 * right for everything but the extent of the allocation: for a slab
 * sub-allocation it would name the slab. RANGE_START_ADDR and RANGE_SIZE are
 * therefore answered from the buffer table, as for the original cuMemAlloc,
 * and BUFFER_ID with the allocation's own id (sub-allocations of one slab
 * would otherwise share one; caches keyed on it, UCX's among them, must see
 * distinct allocations). */
#include "buftab.h"
#include "gate.h"
#include "real.h"

static void fix(CUpointer_attribute attr, void *data, CUdeviceptr ptr)
{
	struct buf b;

	if (!data)
		return;
	if (attr != CU_POINTER_ATTRIBUTE_RANGE_START_ADDR && attr != CU_POINTER_ATTRIBUTE_RANGE_SIZE &&
	    attr != CU_POINTER_ATTRIBUTE_BUFFER_ID)
		return;
	if (buftab_lookup(ptr, &b) < 0 || !buf_owned(&b))
		return;
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = b.base;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = b.size;
		break;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
		*(unsigned long long *)data = b.id;
		break;
	default:
		break;
	}
}

SHIM_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	SHIM_KEEP_ERRNO;
	CUresult r;

	gate_pass();
	real_ensure();
	if (!real.cuPointerGetAttribute)
		return real_absent("cuPointerGetAttribute");
	r = real.cuPointerGetAttribute(data, attribute, ptr);
	if (r == CUDA_SUCCESS)
		fix(attribute, data, ptr);
	return r;
}

SHIM_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
					    void **data, CUdeviceptr ptr)
{
	SHIM_KEEP_ERRNO;
	unsigned int i;
	CUresult r;

	gate_pass();
	real_ensure();
	if (!real.cuPointerGetAttributes)
		return real_absent("cuPointerGetAttributes");
	r = real.cuPointerGetAttributes(numAttributes, attributes, data, ptr);
	if (r == CUDA_SUCCESS && attributes && data)
		for (i = 0; i < numAttributes; i++)
			fix(attributes[i], data[i], ptr);
	return r;
}
