/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Parsing an IPv4 packet into the facts every later step needs. L4 fields
 * are read with bpf_skb_load_bytes so that the IP options' variable length
 * never has to be proven to the verifier against data_end.
 */
#ifndef CELLIUM_LIB_PACKET_H
#define CELLIUM_LIB_PACKET_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include <cellium/common.h>

#define CEL_TCP_FIN 0x01
#define CEL_TCP_SYN 0x02
#define CEL_TCP_RST 0x04
#define CEL_TCP_ACK 0x10

#define CEL_ICMP_ECHO_REPLY 0
#define CEL_ICMP_ECHO_REQUEST 8

#define CEL_IP_MF 0x2000
#define CEL_IP_OFFSET 0x1fff

/* Where a packet stands in its datagram (struct pkt's frag). */
#define CEL_FRAG_NONE 0
/* Offset 0 with more to come: carries the L4 header for the whole datagram. */
#define CEL_FRAG_FIRST 1
/* Offset > 0: no L4 header; its ports come from the first (lib/frag.h). */
#define CEL_FRAG_LATER 2

struct pkt {
	__u32 len;
	__be32 saddr;
	__be32 daddr;
	__be16 sport; /* ICMP echo request: identifier */
	__be16 dport; /* ICMP echo reply: identifier */
	__u8 protocol;
	__u8 tcp_flags;
	__u16 l4_off;
	__be16 frag_id; /* the IP identification of a fragment */
	__u8 frag;      /* CEL_FRAG_* */
	__u8 icmp_type; /* ICMP, not a later fragment: the message's type */
	__u8 icmp_code; /* and code */
};

/* Returns 0 or a CEL_REASON_* drop reason. */
static __always_inline int parse_ipv4(struct __sk_buff *skb, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *ip;

	if (data + ETH_HLEN + sizeof(*ip) > data_end) {
		/* The headers may sit in a fragment of a non-linear skb. */
		if (bpf_skb_pull_data(skb, ETH_HLEN + sizeof(*ip)) < 0)
			return CEL_REASON_MALFORMED;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		if (data + ETH_HLEN + sizeof(*ip) > data_end)
			return CEL_REASON_MALFORMED;
	}
	ip = data + ETH_HLEN;
	if (ip->version != 4 || ip->ihl < 5)
		return CEL_REASON_MALFORMED;

	p->len = skb->len;
	p->saddr = ip->saddr;
	p->daddr = ip->daddr;
	p->protocol = ip->protocol;
	p->l4_off = ETH_HLEN + ip->ihl * 4;
	p->sport = 0;
	p->dport = 0;
	p->tcp_flags = 0;
	p->icmp_type = 0;
	p->icmp_code = 0;
	p->frag = CEL_FRAG_NONE;
	p->frag_id = ip->id;
	/* A later fragment has no L4 header to read: frag4_track gives it its
	 * first fragment's ports. A first fragment too short to hold the
	 * whole header (RFC 1858's tiny fragment) fails to parse below. */
	if (ip->frag_off & bpf_htons(CEL_IP_OFFSET)) {
		p->frag = CEL_FRAG_LATER;
		return 0;
	}
	if (ip->frag_off & bpf_htons(CEL_IP_MF))
		p->frag = CEL_FRAG_FIRST;

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
	case CEL_PROTO_ICMP: {
		__u8 hdr[8];
		__be16 id;

		if (bpf_skb_load_bytes(skb, p->l4_off, hdr, sizeof(hdr)) < 0)
			return CEL_REASON_MALFORMED;
		__builtin_memcpy(&id, &hdr[4], 2);
		p->icmp_type = hdr[0];
		p->icmp_code = hdr[1];
		/* The echo identifier plays the port: the request's "source
		 * port", the reply's "destination port", so a reply's tuple
		 * is the request's reversed. Other ICMP types carry none. */
		if (hdr[0] == CEL_ICMP_ECHO_REQUEST)
			p->sport = id;
		else if (hdr[0] == CEL_ICMP_ECHO_REPLY)
			p->dport = id;
		break;
	}
	default:
		break;
	}
	return 0;
}

#endif /* CELLIUM_LIB_PACKET_H */
