/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Rewriting an IPv4 or IPv6 address and L4 port with incremental checksum
 * updates. The helpers keep CHECKSUM_PARTIAL packets (veth offload) correct:
 * the pseudo-header flag tells the kernel the address is part of the L4 sum.
 * IPv6 has no header checksum: only the L4 sum sees its addresses.
 */
#ifndef CELLIUM_LIB_NAT_H
#define CELLIUM_LIB_NAT_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>

#include "ipv6.h"
#include "packet.h"

#define NAT_SRC 0
#define NAT_DST 1

/* The ICMP (ICMPv6) echo identifier, which plays the port of an echo
 * request (source) and of its reply (destination), sits at the same offset
 * in both: ICMP echo is translated as a port (masquerading, lib/masq.h). */
#define NAT_ICMP_CSUM_OFF 2
#define NAT_ICMP_ID_OFF 4

/* TCP, UDP and ICMP echo are translated; returns 0 or
 * CEL_REASON_NAT_FAILED. */
static __always_inline int nat4_rewrite(struct __sk_buff *skb, struct pkt *p, int which,
					__be32 addr, __be16 port)
{
	__be32 old_addr = which == NAT_DST ? p->daddr : p->saddr;
	__be16 old_port = which == NAT_DST ? p->dport : p->sport;
	__u32 addr_off = ETH_HLEN + (which == NAT_DST ? __builtin_offsetof(struct iphdr, daddr)
						      : __builtin_offsetof(struct iphdr, saddr));
	__u32 port_off = p->l4_off + (which == NAT_DST ? 2 : 0);
	__u32 csum_off;
	/* A UDP checksum of zero means "none" and must stay zero. */
	__u64 mangled = 0;
	/* ICMPv4's checksum covers no pseudo-header: an address change
	 * leaves it alone. */
	__u64 pseudo = BPF_F_PSEUDO_HDR;

	if (p->protocol == CEL_PROTO_TCP) {
		csum_off = p->l4_off + 16;
	} else if (p->protocol == CEL_PROTO_UDP) {
		csum_off = p->l4_off + 6;
		mangled = BPF_F_MARK_MANGLED_0;
	} else if (p->protocol == CEL_PROTO_ICMP) {
		csum_off = p->l4_off + NAT_ICMP_CSUM_OFF;
		port_off = p->l4_off + NAT_ICMP_ID_OFF;
		pseudo = 0;
	} else {
		return CEL_REASON_NAT_FAILED;
	}

	/* A later fragment carries no L4 header: its first fragment's checksum
	 * already covers the translated addresses and port. */
	if (p->frag == CEL_FRAG_LATER) {
		if (old_addr != addr) {
			if (bpf_l3_csum_replace(skb,
						ETH_HLEN + __builtin_offsetof(struct iphdr, check),
						old_addr, addr, sizeof(addr)) < 0)
				return CEL_REASON_NAT_FAILED;
			if (bpf_skb_store_bytes(skb, addr_off, &addr, sizeof(addr), 0) < 0)
				return CEL_REASON_NAT_FAILED;
		}
		goto done;
	}
	if (old_addr != addr) {
		if (pseudo && bpf_l4_csum_replace(skb, csum_off, old_addr, addr,
						  pseudo | mangled | sizeof(addr)) < 0)
			return CEL_REASON_NAT_FAILED;
		if (bpf_l3_csum_replace(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, check),
					old_addr, addr, sizeof(addr)) < 0)
			return CEL_REASON_NAT_FAILED;
		if (bpf_skb_store_bytes(skb, addr_off, &addr, sizeof(addr), 0) < 0)
			return CEL_REASON_NAT_FAILED;
	}
	if (old_port != port) {
		if (bpf_l4_csum_replace(skb, csum_off, old_port, port, mangled | sizeof(port)) < 0)
			return CEL_REASON_NAT_FAILED;
		if (bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0) < 0)
			return CEL_REASON_NAT_FAILED;
	}

done:
	if (which == NAT_DST) {
		p->daddr = addr;
		p->dport = port;
	} else {
		p->saddr = addr;
		p->sport = port;
	}
	return 0;
}

/* The L4 checksum's offset and flags for a translated protocol; -1 for
 * protocols that are not translated. */
static __always_inline int nat_l4_csum(__u8 protocol, __u16 l4_off, __u32 *csum_off,
				       __u64 *mangled)
{
	if (protocol == CEL_PROTO_TCP) {
		*csum_off = l4_off + 16;
		*mangled = 0;
		return 0;
	}
	if (protocol == CEL_PROTO_UDP) {
		*csum_off = l4_off + 6;
		/* A result of zero is sent as 0xffff (IPv4's "no checksum"
		 * stays zero). */
		*mangled = BPF_F_MARK_MANGLED_0;
		return 0;
	}
	return -1;
}

/* nat4_rewrite for IPv6; returns 0 or CEL_REASON_NAT_FAILED. */
static __always_inline int nat6_rewrite(struct __sk_buff *skb, struct pkt6 *p, int which,
					const __u8 *addr, __be16 port)
{
	__u8 *cur = which == NAT_DST ? p->daddr : p->saddr;
	__be16 old_port = which == NAT_DST ? p->dport : p->sport;
	__u32 addr_off = ETH_HLEN + (which == NAT_DST ? __builtin_offsetof(struct ipv6hdr, daddr)
						      : __builtin_offsetof(struct ipv6hdr, saddr));
	__u32 port_off = p->l4_off + (which == NAT_DST ? 2 : 0);
	__u32 csum_off = 0;
	__u64 mangled = 0;
	__s64 diff;

	if (p->protocol == CEL_PROTO_ICMPV6) {
		/* ICMPv6's checksum covers the pseudo-header, as TCP's. */
		csum_off = p->l4_off + NAT_ICMP_CSUM_OFF;
		port_off = p->l4_off + NAT_ICMP_ID_OFF;
	} else if (nat_l4_csum(p->protocol, p->l4_off, &csum_off, &mangled) < 0) {
		return CEL_REASON_NAT_FAILED;
	}
	/* A later fragment carries no L4 header: its first fragment's
	 * checksum already covers the translated addresses and port. */
	if (p->frag != CEL_FRAG_LATER) {
		diff = bpf_csum_diff((__be32 *)cur, 16, (__be32 *)addr, 16, 0);
		if (diff < 0)
			return CEL_REASON_NAT_FAILED;
		if (bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR | mangled) < 0)
			return CEL_REASON_NAT_FAILED;
		if (old_port != port) {
			if (bpf_l4_csum_replace(skb, csum_off, old_port, port,
						mangled | sizeof(port)) < 0)
				return CEL_REASON_NAT_FAILED;
			if (bpf_skb_store_bytes(skb, port_off, &port, sizeof(port), 0) < 0)
				return CEL_REASON_NAT_FAILED;
		}
	}
	if (bpf_skb_store_bytes(skb, addr_off, addr, 16, 0) < 0)
		return CEL_REASON_NAT_FAILED;
	__builtin_memcpy(cur, addr, 16);
	if (which == NAT_DST)
		p->dport = port;
	else
		p->sport = port;
	return 0;
}

#endif /* CELLIUM_LIB_NAT_H */
