/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Parsing an IPv6 packet into the facts every later step needs: its
 * addresses, its extension-header chain walked to the upper layer (or to a
 * fragment header whose offset says that no upper layer follows), the L4
 * ports, and what link-local control needs to know.
 *
 * The chain: hop-by-hop options (first only), destination options, routing
 * (with no segments left: otherwise the destination is not the one policy
 * would decide for), authentication and fragment headers are walked, at most
 * CEL_IPV6_MAX_EXT_HDRS of them. Any other extension header the IANA lists
 * (mobility, HIP, shim6, the experimental ones), a second fragment header, a
 * hop-by-hop header elsewhere than first, or a longer chain is
 * CEL_REASON_EXTENSION_HEADER: dropped, never passed unchecked. Anything
 * else is the upper-layer protocol, as for IPv4 (ESP and "no next header"
 * included: policy decides them by protocol).
 */
#ifndef CELLIUM_LIB_IPV6_H
#define CELLIUM_LIB_IPV6_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include <cellium/common.h>

#include "packet.h"

#define CEL_IPV6_HOPOPTS 0
#define CEL_IPV6_ROUTING 43
#define CEL_IPV6_FRAGMENT 44
#define CEL_IPV6_AUTH 51
#define CEL_IPV6_DSTOPTS 60
#define CEL_IPV6_MOBILITY 135
#define CEL_IPV6_HIP 139
#define CEL_IPV6_SHIM6 140
#define CEL_IPV6_EXPERIMENT1 253
#define CEL_IPV6_EXPERIMENT2 254

#define CEL_IPV6_MAX_EXT_HDRS 8

#define CEL_ICMP6_ECHO_REQUEST 128
#define CEL_ICMP6_ECHO_REPLY 129
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

/* The fragment header's offset field (8-octet units, in its upper 13 bits)
 * and its "more fragments" flag. */
#define CEL_IP6_OFFSET 0xfff8
#define CEL_IP6_MF 0x0001

struct pkt6 {
	__u32 len;
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport; /* ICMPv6 echo request: identifier */
	__be16 dport; /* ICMPv6 echo reply: identifier */
	__u8 protocol; /* the upper layer (a later fragment: its fragment
			* header's next header until frag6_track) */
	__u8 tcp_flags;
	__u16 l4_off;
	__be32 frag_id;  /* the fragment header's identification */
	__u8 frag;       /* CEL_FRAG_* */
	__u8 frag_proto; /* the fragment header's next header */
	__u8 hop_limit;
	__u8 first_hdr;  /* the fixed header's next header */
	__u8 ext_hdrs;   /* extension headers before the upper layer */
	__u8 icmp_type;  /* valid when protocol is ICMPv6 and not a later fragment */
	__u8 icmp_code;  /* likewise */
	__u8 pad;
};

/* Reads the upper layer's ports (ICMPv6: type and echo identifier). A first
 * fragment too short to hold the whole header is malformed (RFC 7112: the
 * first fragment carries the whole header chain). */
static __always_inline int parse_l4_6(struct __sk_buff *skb, struct pkt6 *p)
{
	switch (p->protocol) {
	case CEL_PROTO_TCP: {
		__u8 hdr[14];

		if (bpf_skb_load_bytes(skb, p->l4_off, hdr, sizeof(hdr)) < 0)
			return CEL_REASON_MALFORMED;
		__builtin_memcpy(&p->sport, &hdr[0], 2);
		__builtin_memcpy(&p->dport, &hdr[2], 2);
		p->tcp_flags = hdr[13];
		break;
	}
	case CEL_PROTO_UDP:
	case CEL_PROTO_SCTP: {
		__be16 ports[2];

		if (bpf_skb_load_bytes(skb, p->l4_off, ports, sizeof(ports)) < 0)
			return CEL_REASON_MALFORMED;
		p->sport = ports[0];
		p->dport = ports[1];
		break;
	}
	case CEL_PROTO_ICMPV6: {
		__u8 hdr[8];
		__be16 id;

		if (bpf_skb_load_bytes(skb, p->l4_off, hdr, sizeof(hdr)) < 0)
			return CEL_REASON_MALFORMED;
		p->icmp_type = hdr[0];
		p->icmp_code = hdr[1];
		__builtin_memcpy(&id, &hdr[4], 2);
		/* As for ICMP: the echo identifier plays the port. */
		if (hdr[0] == CEL_ICMP6_ECHO_REQUEST)
			p->sport = id;
		else if (hdr[0] == CEL_ICMP6_ECHO_REPLY)
			p->dport = id;
		break;
	}
	default:
		break;
	}
	return 0;
}

/* Returns 0 or a CEL_REASON_* drop reason. */
static __always_inline int parse_ipv6(struct __sk_buff *skb, struct pkt6 *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 off = ETH_HLEN + sizeof(struct ipv6hdr);
	struct ipv6hdr *ip;
	__u8 nh;
	int i;

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
	p->hop_limit = ip->hop_limit;
	nh = ip->nexthdr;
	p->first_hdr = nh;

#pragma unroll
	for (i = 0; i < CEL_IPV6_MAX_EXT_HDRS; i++) {
		__u8 h[8];

		switch (nh) {
		case CEL_IPV6_HOPOPTS:
			if (i != 0)
				return CEL_REASON_EXTENSION_HEADER;
			/* fallthrough */
		case CEL_IPV6_DSTOPTS:
		case CEL_IPV6_ROUTING:
		case CEL_IPV6_AUTH:
			/* Next header, length, and for routing the type and
			 * the segments left. */
			if (bpf_skb_load_bytes(skb, off, h, 4) < 0)
				return CEL_REASON_MALFORMED;
			if (nh == CEL_IPV6_ROUTING && h[3] != 0)
				return CEL_REASON_EXTENSION_HEADER;
			/* Lengths in 8-octet units past the first 8, the
			 * authentication header's in 4-octet units past 8. */
			off += nh == CEL_IPV6_AUTH ? ((__u32)h[1] + 2) * 4 : ((__u32)h[1] + 1) * 8;
			nh = h[0];
			p->ext_hdrs++;
			break;
		case CEL_IPV6_FRAGMENT: {
			__be16 fo;

			if (p->frag != CEL_FRAG_NONE)
				return CEL_REASON_EXTENSION_HEADER;
			if (bpf_skb_load_bytes(skb, off, h, 8) < 0)
				return CEL_REASON_MALFORMED;
			__builtin_memcpy(&fo, &h[2], 2);
			__builtin_memcpy(&p->frag_id, &h[4], 4);
			off += 8;
			nh = h[0];
			p->ext_hdrs++;
			p->frag_proto = nh;
			if (fo & bpf_htons(CEL_IP6_OFFSET)) {
				/* What follows is data: the upper layer and
				 * its ports come from the first fragment. */
				p->frag = CEL_FRAG_LATER;
				p->protocol = nh;
				return 0;
			}
			/* Offset 0 and no more fragments is an atomic
			 * fragment (RFC 6946): a whole datagram. */
			if (fo & bpf_htons(CEL_IP6_MF))
				p->frag = CEL_FRAG_FIRST;
			break;
		}
		case CEL_IPV6_MOBILITY:
		case CEL_IPV6_HIP:
		case CEL_IPV6_SHIM6:
		case CEL_IPV6_EXPERIMENT1:
		case CEL_IPV6_EXPERIMENT2:
			return CEL_REASON_EXTENSION_HEADER;
		default:
			p->protocol = nh;
			p->l4_off = off;
			return parse_l4_6(skb, p);
		}
	}
	return CEL_REASON_EXTENSION_HEADER;
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
	if (p->protocol != CEL_PROTO_ICMPV6 || p->frag == CEL_FRAG_LATER)
		return 0;
	switch (p->icmp_type) {
	case CEL_ICMP6_ROUTER_SOLICIT:
	case CEL_ICMP6_NEIGH_SOLICIT:
	case CEL_ICMP6_NEIGH_ADVERT:
		return p->ext_hdrs == 0 && p->hop_limit == CEL_ND_HOP_LIMIT;
	case CEL_ICMP6_MLD_QUERY:
	case CEL_ICMP6_MLD_REPORT:
	case CEL_ICMP6_MLD_DONE:
	case CEL_ICMP6_MLD2_REPORT:
		return p->ext_hdrs == 1 && p->first_hdr == CEL_IPV6_HOPOPTS &&
		       p->hop_limit == CEL_MLD_HOP_LIMIT;
	default:
		return 0;
	}
}

#endif /* CELLIUM_LIB_IPV6_H */
