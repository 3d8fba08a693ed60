/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Per-CPU scratch space for the largest per-packet state of the IPv6 path
 * (and of the IPv4 paths), kept off the 512-byte BPF stack that the inlined
 * programs share. A program runs to completion on its CPU before another
 * packet's program may start there (tc runs with bottom halves off), so one
 * slot per CPU is enough.
 */
#ifndef CELLIUM_LIB_SCRATCH_H
#define CELLIUM_LIB_SCRATCH_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "ipv6.h"
#include "lb.h"
#include "maps.h"
#include "nodeport.h"

/* Masquerading's working memory (lib/masq.h), kept off the stack: what
 * cel_from_container's own frame leaves its callees is under 100 bytes of
 * the verifier's 512 for a call chain. Not cleared per packet: masq.h
 * writes every field before it reads it. */
struct masq_work {
	struct bpf_fib_lookup fib;
	struct snat4_work snat4;
	struct snat6_work snat6;
};

struct scratch6 {
	struct pkt6 p;
	struct ct6_key key;
	struct lb6_choice lb6;
	struct pkt p4;
	struct ct_key key4;
	struct lb4_choice lb4;
	struct masq_work masq;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct scratch6);
	__uint(max_entries, 1);
} cel_scratch6 SEC(".maps");

/* This CPU's slot with its IPv6 part (p, key, lb6) zeroed; NULL only if the
 * map is missing. Each family clears only its own part: the memset is paid
 * on every packet. */
static __always_inline struct scratch6 *scratch6(void)
{
	__u32 zero = 0;
	struct scratch6 *s = bpf_map_lookup_elem(&cel_scratch6, &zero);

	if (s)
		__builtin_memset(s, 0, __builtin_offsetof(struct scratch6, p4));
	return s;
}

/* This CPU's slot with its IPv4 part (p4, key4, lb4) zeroed. */
static __always_inline struct scratch6 *scratch4(void)
{
	__u32 zero = 0;
	struct scratch6 *s = bpf_map_lookup_elem(&cel_scratch6, &zero);

	if (s)
		__builtin_memset(&s->p4, 0,
				 __builtin_offsetof(struct scratch6, masq) -
					 __builtin_offsetof(struct scratch6, p4));
	return s;
}

#endif /* CELLIUM_LIB_SCRATCH_H */
