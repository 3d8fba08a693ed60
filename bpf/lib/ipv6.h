/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * IPv6, until the datapath can enforce policy on it: fail closed.
 *
 * Neither conntrack, services nor policy know IPv6 yet, so IPv6 may only
 * pass where no policy applies, and never from an address the pod does not
 * own. From a pod (cel_from_container), a packet passes when its source is
 * an IPv6 address of the endpoint behind this interface, that endpoint does
 * not enforce egress, and the destination, if a local endpoint, does not
 * enforce ingress. To a pod (cel_to_container), a packet passes when its
 * destination is an IPv6 address of the endpoint behind this interface and
 * that endpoint does not enforce ingress. Everything else is dropped:
 * INVALID_SOURCE for a source the pod does not own, IPV6_NOT_ENFORCED for
 * the rest.
 *
 * The exception is link-local control that no router ever forwards, which
 * both stacks need whatever the policy (ipv6_link_control): the node
 * resolving a pod's address and the pod answering, duplicate address
 * detection, multicast listener reports. Anything it cannot classify (an
 * extension header other than the one hop-by-hop header MLD carries, a
 * message it cannot read) is not control, so it falls under the rules
 * above: dropped wherever policy applies.
 */
#ifndef CELLIUM_LIB_IPV6_H
#define CELLIUM_LIB_IPV6_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "lookup.h"
#include "maps.h"
#include "notify.h"

#define CEL_PROTO_HOPOPTS 0
#define CEL_PROTO_ICMPV6 58

#define CEL_ICMP6_MLD_QUERY 130
#define CEL_ICMP6_MLD_REPORT 131
#define CEL_ICMP6_MLD_DONE 132
#define CEL_ICMP6_ROUTER_SOLICIT 133
#define CEL_ICMP6_NEIGH_SOLICIT 135
#define CEL_ICMP6_NEIGH_ADVERT 136
#define CEL_ICMP6_MLD2_REPORT 143

/* Hop limits that prove a message was not forwarded (RFC 4861, 3810). */
#define CEL_ND_HOP_LIMIT 255
#define CEL_MLD_HOP_LIMIT 1

struct pkt6 {
	__u32 len;
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport; /* TCP, UDP, SCTP right after the fixed header: for events */
	__be16 dport;
	__u8 nexthdr; /* of the fixed header */
	__u8 hop_limit;
	__u8 icmp_type; /* valid when is_icmp */
	__u8 is_icmp;   /* an ICMPv6 message follows the fixed header, or hbh */
	__u8 hbh;       /* ... after exactly one hop-by-hop options header */
};

/* Returns 0 or CEL_REASON_MALFORMED. */
static __always_inline int parse_ipv6(struct __sk_buff *skb, struct pkt6 *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 off = ETH_HLEN + sizeof(struct ipv6hdr);
	struct ipv6hdr *ip;

	p->len = skb->len;
	if (data + off > data_end) {
		/* The header may sit in a fragment of a non-linear skb. */
		if (bpf_skb_pull_data(skb, off) < 0)
			return CEL_REASON_MALFORMED;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		if (data + off > data_end)
			return CEL_REASON_MALFORMED;
	}
	ip = data + ETH_HLEN;
	if (ip->version != 6)
		return CEL_REASON_MALFORMED;
	__builtin_memcpy(p->saddr, &ip->saddr, 16);
	__builtin_memcpy(p->daddr, &ip->daddr, 16);
	p->nexthdr = ip->nexthdr;
	p->hop_limit = ip->hop_limit;

	switch (p->nexthdr) {
	case CEL_PROTO_ICMPV6:
		if (bpf_skb_load_bytes(skb, off, &p->icmp_type, 1) == 0)
			p->is_icmp = 1;
		break;
	case CEL_PROTO_HOPOPTS: {
		/* Next header, then length in 8-octet units past the first 8. */
		__u8 h[2];

		if (bpf_skb_load_bytes(skb, off, h, sizeof(h)) < 0 || h[0] != CEL_PROTO_ICMPV6)
			break;
		if (bpf_skb_load_bytes(skb, off + ((__u32)h[1] + 1) * 8, &p->icmp_type, 1) == 0) {
			p->is_icmp = 1;
			p->hbh = 1;
		}
		break;
	}
	case CEL_PROTO_TCP:
	case CEL_PROTO_UDP:
	case CEL_PROTO_SCTP: {
		__be16 ports[2];

		if (bpf_skb_load_bytes(skb, off, ports, sizeof(ports)) == 0) {
			p->sport = ports[0];
			p->dport = ports[1];
		}
		break;
	}
	default:
		break;
	}
	return 0;
}

static __always_inline int ipv6_unspecified(const __u8 *a)
{
	__u32 w[4];

	__builtin_memcpy(w, a, 16);
	return (w[0] | w[1] | w[2] | w[3]) == 0;
}

/* fe80::/10 */
static __always_inline int ipv6_link_local(const __u8 *a)
{
	return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

/* Link-local in scope: fe80::/10 unicast, or a multicast group of link
 * scope (ffX2::/16). The node never forwards either. */
static __always_inline int ipv6_link_scope(const __u8 *a)
{
	return ipv6_link_local(a) || (a[0] == 0xff && (a[1] & 0x0f) == 0x02);
}

/*
 * Whether the packet is link-local control that passes whatever the
 * policy, as far as its message goes (the callers check its addresses):
 *  - router solicitation, neighbour solicitation and advertisement with
 *    hop limit 255 and nothing between the fixed header and the message:
 *    receivers discard ND with any other hop limit (RFC 4861), so a
 *    forwarded copy is worthless;
 *  - MLD queries, reports and done with hop limit 1 behind one hop-by-hop
 *    header (RFC 2710, 3810: its router alert): a router cannot forward
 *    a packet whose hop limit is 1.
 * Router advertisements and redirects are left out: pods are configured
 * statically and take no routing advice.
 */
static __always_inline int ipv6_link_control(const struct pkt6 *p)
{
	if (!p->is_icmp)
		return 0;
	switch (p->icmp_type) {
	case CEL_ICMP6_ROUTER_SOLICIT:
	case CEL_ICMP6_NEIGH_SOLICIT:
	case CEL_ICMP6_NEIGH_ADVERT:
		return !p->hbh && p->hop_limit == CEL_ND_HOP_LIMIT;
	case CEL_ICMP6_MLD_QUERY:
	case CEL_ICMP6_MLD_REPORT:
	case CEL_ICMP6_MLD_DONE:
	case CEL_ICMP6_MLD2_REPORT:
		return p->hbh && p->hop_limit == CEL_MLD_HOP_LIMIT;
	default:
		return 0;
	}
}

static __always_inline int drop6(struct __sk_buff *skb, const struct pkt6 *p,
				 const struct trace *t, __u8 reason)
{
	struct event *e;

	count(t->direction, reason, skb->len);
	e = event_start(skb, t, CEL_EVENT_DROP, reason, CEL_VERDICT_DENIED);
	if (e) {
		e->family = CEL_FAMILY_IPV6;
		e->protocol = p->nexthdr;
		__builtin_memcpy(e->saddr, p->saddr, 16);
		__builtin_memcpy(e->daddr, p->daddr, 16);
		e->sport = p->sport;
		e->dport = p->dport;
		e->len = p->len;
		bpf_ringbuf_submit(e, 0);
	}
	return TC_ACT_SHOT;
}

static __always_inline int pass6(struct __sk_buff *skb, __u8 direction)
{
	count(direction, CEL_REASON_FORWARDED, skb->len);
	return TC_ACT_OK;
}

/* TC ingress of a pod's host veth: IPv6 the pod sends. */
static __always_inline int ipv6_from_container(struct __sk_buff *skb)
{
	struct trace t = { .direction = CEL_DIR_EGRESS };
	struct endpoint_info *src, *dst;
	struct pkt6 p = {};
	int ret;

	ret = parse_ipv6(skb, &p);
	if (ret)
		return drop6(skb, &p, &t, ret);

	/* The source counts as the pod's only if its entry names this very
	 * interface: another pod's address is as spoofed as a made-up one. */
	src = endpoint_lookup6(p.saddr);
	if (src && src->ifindex != skb->ifindex)
		src = NULL;
	if (src) {
		t.endpoint_id = src->id;
		t.src_identity = src->identity;
	}
	/* A pod's own ND and MLD: from the unspecified address (DAD), its
	 * link-local address (which it may choose freely, so it is not in the
	 * endpoint map) or one of its own; to the link only. */
	if (ipv6_link_control(&p) && ipv6_link_scope(p.daddr) &&
	    (src || ipv6_unspecified(p.saddr) || ipv6_link_local(p.saddr)))
		return pass6(skb, CEL_DIR_EGRESS);
	if (!src)
		return drop6(skb, &p, &t, CEL_REASON_INVALID_SOURCE);

	dst = endpoint_lookup6(p.daddr);
	t.dst_identity = dst ? dst->identity : ipcache_identity6(p.daddr);
	if (src->flags & CEL_EP_F_ENFORCE_EGRESS)
		return drop6(skb, &p, &t, CEL_REASON_IPV6_NOT_ENFORCED);
	if (dst && (dst->flags & CEL_EP_F_ENFORCE_INGRESS)) {
		struct trace it = t;

		it.direction = CEL_DIR_INGRESS;
		it.endpoint_id = dst->id;
		return drop6(skb, &p, &it, CEL_REASON_IPV6_NOT_ENFORCED);
	}
	/* No redirect: the node's stack forwards it, so a local destination's
	 * cel_to_container sees it too. */
	return pass6(skb, CEL_DIR_EGRESS);
}

/* TC egress of a pod's host veth: IPv6 the node's stack sends the pod. */
static __always_inline int ipv6_to_container(struct __sk_buff *skb)
{
	struct trace t = { .direction = CEL_DIR_INGRESS };
	struct endpoint_info *dst;
	struct pkt6 p = {};
	int ret;

	ret = parse_ipv6(skb, &p);
	if (ret)
		return drop6(skb, &p, &t, ret);

	dst = endpoint_lookup6(p.daddr);
	if (dst && dst->ifindex != skb->ifindex)
		dst = NULL;
	if (dst) {
		t.endpoint_id = dst->id;
		t.dst_identity = dst->identity;
	}
	/* The node's ND and MLD on this link: from the unspecified address or
	 * its link-local one, to the link or to the pod's own address (a
	 * unicast neighbour solicitation confirming it is still there). */
	if (ipv6_link_control(&p) && (dst || ipv6_link_scope(p.daddr)) &&
	    (ipv6_unspecified(p.saddr) || ipv6_link_local(p.saddr)))
		return pass6(skb, CEL_DIR_INGRESS);

	t.src_identity = identity_of6(p.saddr);
	/* Not for one of the pod's own addresses (link-local or multicast
	 * traffic): no endpoint to decide for, so nothing decides it in. */
	if (!dst || (dst->flags & CEL_EP_F_ENFORCE_INGRESS))
		return drop6(skb, &p, &t, CEL_REASON_IPV6_NOT_ENFORCED);
	return pass6(skb, CEL_DIR_INGRESS);
}

#endif /* CELLIUM_LIB_IPV6_H */
