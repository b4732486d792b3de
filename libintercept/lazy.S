/* The slow paths of the generated trampolines: the first call of a forwarded
 * driver function (fwd_lazy_common) and a call that finds the gate closed
 * (fwd_gate_common).
 *
 * A lazy stub pushes its index and jumps to fwd_lazy_common; a trampoline
 * that finds the gate closed pushes its index and jumps to
 * fwd_gate_common. Both save the caller's argument registers (rdi, rsi,
 * rdx, rcx, r8, r9, xmm0-7), %rax (%al counts vector registers in a varargs
 * call) and %r10 (static chain) around a C function of the index:
 * fwd_resolve(index) loads the real driver if needed, stores the target
 * into fwd_table[index] and returns it; gate_slow_fwd(index) waits until
 * the gate opens and returns fwd_table[index] (a lazy stub still, or the
 * driver's function). Then the registers are restored and the call
 * continues at what was returned as if it had been called directly, with
 * the caller's return address on top of the stack. */
#if !defined(__x86_64__)
#error "gpucr shim trampolines are written for x86-64"
#endif

/* On entry: (%rsp) = index, 8(%rsp) = caller's return address. */
.macro SLOW_PATH name, fn
	.globl \name
	.hidden \name
	.type \name, @function
	.p2align 4
\name:
	pushq %rbp
	movq %rsp, %rbp
	pushq %rdi
	pushq %rsi
	pushq %rdx
	pushq %rcx
	pushq %r8
	pushq %r9
	pushq %rax
	pushq %r10
	/* rsp is 8 mod 16 here: 128 bytes for xmm0-7 plus 8 align the call. */
	subq $136, %rsp
	movdqu %xmm0, 0(%rsp)
	movdqu %xmm1, 16(%rsp)
	movdqu %xmm2, 32(%rsp)
	movdqu %xmm3, 48(%rsp)
	movdqu %xmm4, 64(%rsp)
	movdqu %xmm5, 80(%rsp)
	movdqu %xmm6, 96(%rsp)
	movdqu %xmm7, 112(%rsp)
	movq 8(%rbp), %rdi
	call \fn
	movq %rax, %r11
	movdqu 0(%rsp), %xmm0
	movdqu 16(%rsp), %xmm1
	movdqu 32(%rsp), %xmm2
	movdqu 48(%rsp), %xmm3
	movdqu 64(%rsp), %xmm4
	movdqu 80(%rsp), %xmm5
	movdqu 96(%rsp), %xmm6
	movdqu 112(%rsp), %xmm7
	addq $136, %rsp
	popq %r10
	popq %rax
	popq %r9
	popq %r8
	popq %rcx
	popq %rdx
	popq %rsi
	popq %rdi
	popq %rbp
	addq $8, %rsp		/* drop the index */
	jmp *%r11
	.size \name, .-\name
.endm

	.text
	SLOW_PATH fwd_lazy_common, fwd_resolve
	SLOW_PATH fwd_gate_common, gate_slow_fwd

	.section .note.GNU-stack,"",@progbits
