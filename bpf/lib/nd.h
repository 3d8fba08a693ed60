/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Neighbour discovery towards the node, answered by the datapath.
 *
 * A pod reaches everything through its IPv6 gateway, the pool's router
 * address, which the node holds on cellium_host: no device on the pod's link
 * holds it, so the node's stack would never answer a solicitation for it.
 * The plumbing gives every pod a permanent neighbour entry for it; a pod that
 * loses or replaces that entry solicits the address (to its solicited-node
 * group, then unicast to confirm a stale entry). The datapath answers a
 * solicitation for any address of the node (host in the ipcache) with an
 * advertisement, sent straight back into the pod, as Cilium answers for its
 * router (nd_answer says which ones and how).
 */
#ifndef CELLIUM_LIB_ND_H
#define CELLIUM_LIB_ND_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "ipv6.h"
#include "lookup.h"
#include "notify.h"

/* The advertisement's ICMPv6 message: 24 bytes, and 8 more with the
 * target link-layer address option. */
#define CEL_NA_LEN 24
#define CEL_NA_TLLA_LEN 8
#define CEL_NA_OFF (ETH_HLEN + 40)
#define CEL_NA_MAX_FRAME (CEL_NA_OFF + CEL_NA_LEN + CEL_NA_TLLA_LEN)
/* Router, solicited, override. */
#define CEL_NA_FLAGS 0xe0

/* The 16-bit one's complement of a partial sum. */
static __always_inline __u16 csum_fold32(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/*
 * If the packet (link-local control the pod sent) is a neighbour
 * solicitation for an address of the node, turns it into the advertisement
 * and returns the verdict that delivers it to the pod; otherwise returns -1
 * and leaves the packet alone.
 *
 * A solicitation from one of the pod's own addresses (`src`, the endpoint
 * owning it) is answered with the host end's MAC in a target link-layer
 * address option. Linux confirms a stale entry with a unicast solicitation
 * from its link-local address (no endpoint is known by it): that one is
 * answered without the option (RFC 4861 7.2.4 allows it for unicast
 * solicitations), from and to the MACs it came with, which confirms the
 * entry the pod holds and teaches it nothing. A multicast solicitation from
 * a link-local address is left alone: nothing says which MAC to give.
 */
static __always_inline int nd_answer(struct __sk_buff *skb, const struct pkt6 *p,
				     const struct endpoint_info *src,
				     const struct datapath_config *cfg)
{
	/* Padded to a multiple of four for the checksum helper. */
	__u8 f[CEL_NA_MAX_FRAME + 2] = {};
	__u8 tail[8] = { 0, 0, 0, 0, 0, 0, 0, CEL_PROTO_ICMPV6 };
	__u32 icmp_len = CEL_NA_LEN;
	__u8 target[16];
	__s64 sum;

	if (p->icmp_type != CEL_ICMP6_NEIGH_SOLICIT)
		return -1;
	if (bpf_skb_load_bytes(skb, p->l4_off + 8, target, sizeof(target)) < 0)
		return -1;
	if (ipcache_identity6(cfg, target) != CEL_IDENTITY_HOST)
		return -1;

	if (src) {
		__builtin_memcpy(&f[0], src->pod_mac, 6);
		__builtin_memcpy(&f[6], src->host_mac, 6);
		f[CEL_NA_OFF + CEL_NA_LEN] = 2; /* target link-layer address */
		f[CEL_NA_OFF + CEL_NA_LEN + 1] = 1; /* one 8-octet unit */
		__builtin_memcpy(&f[CEL_NA_OFF + CEL_NA_LEN + 2], src->host_mac, 6);
		icmp_len += CEL_NA_TLLA_LEN;
	} else {
		__u8 macs[12];

		if (!ipv6_link_local(p->saddr))
			return -1;
		if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)) < 0)
			return -1;
		/* A multicast (group bit) destination: not a confirmation. */
		if (macs[0] & 1)
			return -1;
		__builtin_memcpy(&f[0], &macs[6], 6);
		__builtin_memcpy(&f[6], &macs[0], 6);
	}
	f[12] = 0x86;
	f[13] = 0xdd;
	f[14] = 0x60;
	f[19] = icmp_len;
	f[20] = CEL_PROTO_ICMPV6;
	f[21] = CEL_ND_HOP_LIMIT;
	__builtin_memcpy(&f[22], target, 16);
	__builtin_memcpy(&f[38], p->saddr, 16);
	f[CEL_NA_OFF] = CEL_ICMP6_NEIGH_ADVERT;
	f[CEL_NA_OFF + 4] = CEL_NA_FLAGS;
	__builtin_memcpy(&f[CEL_NA_OFF + 8], target, 16);
	tail[3] = icmp_len;

	/* Over the pseudo-header (addresses, length, next header) and the
	 * message; the sum is in memory order, as it is stored. */
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&f[22], 32, 0);
	if (sum < 0)
		return -1;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)tail, sizeof(tail), sum);
	if (sum < 0)
		return -1;
	if (src)
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&f[CEL_NA_OFF],
				    CEL_NA_LEN + CEL_NA_TLLA_LEN, sum);
	else
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&f[CEL_NA_OFF], CEL_NA_LEN, sum);
	if (sum < 0)
		return -1;
	{
		__u16 csum = csum_fold32((__u64)sum);

		__builtin_memcpy(&f[CEL_NA_OFF + 2], &csum, 2);
	}

	if (bpf_skb_change_tail(skb, CEL_NA_OFF + icmp_len, 0) < 0)
		return -1;
	if (src) {
		if (bpf_skb_store_bytes(skb, 0, f, CEL_NA_MAX_FRAME, 0) < 0)
			return TC_ACT_SHOT;
	} else if (bpf_skb_store_bytes(skb, 0, f, CEL_NA_OFF + CEL_NA_LEN, 0) < 0) {
		return TC_ACT_SHOT;
	}
	count(CEL_DIR_EGRESS, CEL_REASON_FORWARDED, CEL_NA_OFF + icmp_len);
	return bpf_redirect_peer(skb->ifindex, 0);
}

#endif /* CELLIUM_LIB_ND_H */
