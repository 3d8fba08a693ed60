/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Fragments follow their first fragment (cel_frag4, include/cellium/frag.h).
 * The first fragment records its ports; a later fragment takes them and then
 * goes the way of any packet with those ports: conntrack finds the entry its
 * first created (or policy decides again, with the same ports and so the
 * same verdict), a service's remembered backend translates it. Only its
 * addresses are rewritten, its first fragment's checksum covering the rest.
 */
#ifndef CELLIUM_LIB_FRAG_H
#define CELLIUM_LIB_FRAG_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "ipv6.h"
#include "maps.h"
#include "packet.h"

/* Called once the packet's source (from a pod) or destination (to a pod)
 * is known to be the endpoint's, so that no spoofed source can fill the
 * table. Returns 0 or a drop reason. */
static __always_inline int frag4_track(struct pkt *p)
{
	struct frag4_key key = {};
	struct frag_ports *found;

	if (p->frag == CEL_FRAG_NONE)
		return 0;
	key.saddr = p->saddr;
	key.daddr = p->daddr;
	key.id = p->frag_id;
	key.protocol = p->protocol;
	if (p->frag == CEL_FRAG_FIRST) {
		struct frag_ports ports = {
			.sport = p->sport, .dport = p->dport, .protocol = p->protocol
		};

		if (bpf_map_update_elem(&cel_frag4, &key, &ports, BPF_ANY) < 0)
			return CEL_REASON_FRAGMENT_TABLE_FULL;
		return 0;
	}
	found = bpf_map_lookup_elem(&cel_frag4, &key);
	if (!found)
		return CEL_REASON_FRAGMENT_NOT_FOUND;
	p->sport = found->sport;
	p->dport = found->dport;
	return 0;
}

/* frag4_track for IPv6: keyed on the fragment header's identification and
 * next header; a later fragment also takes the upper-layer protocol, which
 * further extension headers may hide behind its fragment header. */
static __always_inline int frag6_track(struct pkt6 *p)
{
	struct frag6_key key = {};
	struct frag_ports *found;

	if (p->frag == CEL_FRAG_NONE)
		return 0;
	__builtin_memcpy(key.saddr, p->saddr, 16);
	__builtin_memcpy(key.daddr, p->daddr, 16);
	key.id = p->frag_id;
	key.protocol = p->frag_proto;
	if (p->frag == CEL_FRAG_FIRST) {
		struct frag_ports ports = {
			.sport = p->sport, .dport = p->dport, .protocol = p->protocol
		};

		if (bpf_map_update_elem(&cel_frag6, &key, &ports, BPF_ANY) < 0)
			return CEL_REASON_FRAGMENT_TABLE_FULL;
		return 0;
	}
	found = bpf_map_lookup_elem(&cel_frag6, &key);
	if (!found)
		return CEL_REASON_FRAGMENT_NOT_FOUND;
	p->protocol = found->protocol;
	p->sport = found->sport;
	p->dport = found->dport;
	return 0;
}

#endif /* CELLIUM_LIB_FRAG_H */
