/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Native routing's fast path for a pod's packet to another node: the
 * node's FIB picks the device and next hop (the route node-discovery keeps
 * to that node's pod CIDR, or the underlay's own), and the packet goes
 * straight to that device with its neighbour resolved by the kernel, past
 * this node's stack, as the other node's cel_from_netdev hands it on. */
#ifndef CEL_LIB_FIB_H
#define CEL_LIB_FIB_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "../include/cellium/common.h"
#include "lookup.h"
#include "ipv6.h"
#include "packet.h"

#define CEL_AF_INET 2
#define CEL_IPV4_TTL_OFF (ETH_HLEN + 8)
#define CEL_IPV4_CSUM_OFF (ETH_HLEN + 10)

/* Whether a destination of this identity is a cluster peer the fast path
 * may take: another node's pod (a cluster identity) or another node.
 * Everything else (the world, this node, CIDR identities) goes through the
 * node's stack, which may masquerade, filter or deliver it locally. */
static __always_inline int is_cluster_peer(__u32 identity)
{
	return identity == CEL_IDENTITY_REMOTE_NODE || (identity >= 256 && identity <= 65535);
}

/* The node's FIB's route for an IPv4 packet arriving on skb's device
 * (flags: BPF_FIB_LOOKUP_SRC also picks the source address the node would
 * send from). Returns 0 if there is one, -1 if not (no route, a TTL about
 * to expire: the stack answers that one). */
static __always_inline int fib_lookup4(struct __sk_buff *skb, const struct pkt *p,
				       struct bpf_fib_lookup *fib, __u32 flags)
{
	__u8 ttl;
	int ret;

	if (bpf_skb_load_bytes(skb, CEL_IPV4_TTL_OFF, &ttl, 1) < 0 || ttl <= 1)
		return -1;
	fib->family = CEL_AF_INET;
	fib->l4_protocol = p->protocol;
	fib->ipv4_src = p->saddr;
	fib->ipv4_dst = p->daddr;
	fib->ifindex = skb->ifindex;
	ret = bpf_fib_lookup(skb, fib, sizeof(*fib), flags);
	return ret == BPF_FIB_LKUP_RET_SUCCESS || ret == BPF_FIB_LKUP_RET_NO_NEIGH ? 0 : -1;
}

/* Sends an IPv4 packet the way fib_lookup4 found: the TTL decremented as a
 * router does, then redirected to the device, the kernel resolving the
 * next hop's neighbour. */
static __always_inline int fib_forward4(struct __sk_buff *skb, const struct pkt *p,
					const struct bpf_fib_lookup *fib)
{
	struct bpf_redir_neigh nh = {};
	__u8 ttl;

	if (bpf_skb_load_bytes(skb, CEL_IPV4_TTL_OFF, &ttl, 1) < 0)
		return TC_ACT_SHOT;
	/* The TTL shares a checksummed 16-bit word with the protocol. */
	{
		__be16 old = bpf_htons((__u16)ttl << 8 | p->protocol);
		__be16 new = bpf_htons((__u16)(ttl - 1) << 8 | p->protocol);

		ttl -= 1;
		if (bpf_skb_store_bytes(skb, CEL_IPV4_TTL_OFF, &ttl, 1, 0) < 0 ||
		    bpf_l3_csum_replace(skb, CEL_IPV4_CSUM_OFF, old, new, 2) < 0)
			return TC_ACT_SHOT;
	}
	/* After the lookup ipv4_dst is the next hop (the gateway, if any). */
	nh.nh_family = CEL_AF_INET;
	nh.ipv4_nh = fib->ipv4_dst;
	return bpf_redirect_neigh(fib->ifindex, &nh, sizeof(nh), 0);
}

/* Routes an IPv4 packet past the node's stack (fib_lookup4, fib_forward4).
 * Returns the redirect verdict, or TC_ACT_OK to leave the packet to the
 * node's stack. */
static __always_inline int fib_redirect4(struct __sk_buff *skb, const struct pkt *p)
{
	struct bpf_fib_lookup fib = {};

	if (fib_lookup4(skb, p, &fib, 0) < 0)
		return TC_ACT_OK;
	return fib_forward4(skb, p, &fib);
}

/* Routes a pod's IPv4 packet for another node's pod or another node
 * itself (fib_redirect4); anything else (not a cluster peer) is left to the
 * node's stack. */
static __always_inline int redirect_to_node4(struct __sk_buff *skb,
					     const struct datapath_config *cfg,
					     const struct pkt *p)
{
	if (!is_cluster_peer(ipcache_identity4(cfg, p->daddr)))
		return TC_ACT_OK;
	return fib_redirect4(skb, p);
}

#define CEL_AF_INET6 10
#define CEL_IPV6_HOP_OFF (ETH_HLEN + 7)

/* fib_lookup4 for IPv6. */
static __always_inline int fib_lookup6(struct __sk_buff *skb, const struct pkt6 *p,
				       struct bpf_fib_lookup *fib, __u32 flags)
{
	__u8 hops;
	int ret;

	if (bpf_skb_load_bytes(skb, CEL_IPV6_HOP_OFF, &hops, 1) < 0 || hops <= 1)
		return -1;
	fib->family = CEL_AF_INET6;
	fib->l4_protocol = p->protocol;
	__builtin_memcpy(fib->ipv6_src, p->saddr, 16);
	__builtin_memcpy(fib->ipv6_dst, p->daddr, 16);
	fib->ifindex = skb->ifindex;
	ret = bpf_fib_lookup(skb, fib, sizeof(*fib), flags);
	return ret == BPF_FIB_LKUP_RET_SUCCESS || ret == BPF_FIB_LKUP_RET_NO_NEIGH ? 0 : -1;
}

/* fib_forward4 for IPv6 (its header has no checksum to update). */
static __always_inline int fib_forward6(struct __sk_buff *skb, const struct bpf_fib_lookup *fib)
{
	struct bpf_redir_neigh nh = {};
	__u8 hops;

	if (bpf_skb_load_bytes(skb, CEL_IPV6_HOP_OFF, &hops, 1) < 0)
		return TC_ACT_SHOT;
	hops -= 1;
	if (bpf_skb_store_bytes(skb, CEL_IPV6_HOP_OFF, &hops, 1, 0) < 0)
		return TC_ACT_SHOT;
	nh.nh_family = CEL_AF_INET6;
	__builtin_memcpy(nh.ipv6_nh, fib->ipv6_dst, 16);
	return bpf_redirect_neigh(fib->ifindex, &nh, sizeof(nh), 0);
}

/* fib_redirect4 for IPv6. */
static __always_inline int fib_redirect6(struct __sk_buff *skb, const struct pkt6 *p)
{
	struct bpf_fib_lookup fib = {};

	if (fib_lookup6(skb, p, &fib, 0) < 0)
		return TC_ACT_OK;
	return fib_forward6(skb, &fib);
}

#endif
