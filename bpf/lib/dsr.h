/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Direct server return (the agent's bpf-lb-mode dsr, or hybrid for TCP),
 * native routing, IPv4: a client from outside balanced by a NodePort to
 * another node's backend keeps its source address. The frontend's node
 * DNATs to the backend and adds an IPv4 option naming the frontend (address
 * and port, Cilium's 8-byte layout: type, length, port, address) to the
 * connection's first packet (a TCP SYN; every UDP datagram, as UDP has no
 * first packet the backend's node is sure to see). The backend's node
 * believes the option only from another node, records that the backend's
 * replies leave with the frontend as their source (a cel_snat4 entry keyed
 * on the reply's tuple with CEL_SNAT_F_DSR), and judges the connection on
 * the client's own identity. The replies go from the backend's node
 * straight to the client.
 */
#ifndef CELLIUM_LIB_DSR_H
#define CELLIUM_LIB_DSR_H

#include <linux/bpf.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "conntrack.h"
#include "lookup.h"
#include "maps.h"
#include "nat.h"
#include "packet.h"

/* Copied into fragments (0x80), control class, number 26: Cilium's. */
#define CEL_DSR_OPT_TYPE 0x9a
#define CEL_DSR_OPT_LEN 8
#define CEL_IPV4_HDR_OFF ETH_HLEN
#define CEL_IPV4_OPT_OFF (ETH_HLEN + 20)

struct dsr_opt4 {
	__u8 type;
	__u8 len;
	__be16 port;
	__be32 addr;
};

#define CEL_CFG_F_DSR (CEL_CFG_F_DSR_TCP | CEL_CFG_F_DSR_UDP)

/* Whether the frontend's node sends this packet by DSR rather than SNAT:
 * the mode's protocol, native routing, and a packet that starts the
 * connection at the backend's node. */
static __always_inline int dsr4_wanted(const struct datapath_config *cfg, const struct pkt *p)
{
	if (cfg->tunnel_ifindex)
		return 0;
	if (p->protocol == CEL_PROTO_TCP)
		return (cfg->flags & CEL_CFG_F_DSR_TCP) &&
		       (p->tcp_flags & (CEL_TCP_SYN | CEL_TCP_ACK)) == CEL_TCP_SYN;
	if (p->protocol == CEL_PROTO_UDP)
		return (cfg->flags & CEL_CFG_F_DSR_UDP) && p->frag != CEL_FRAG_LATER;
	return 0;
}

/* Whether a connection of this packet is sent by DSR (its later packets,
 * which carry no option, are not source-translated either). */
static __always_inline int dsr4_mode(const struct datapath_config *cfg, const struct pkt *p)
{
	if (cfg->tunnel_ifindex)
		return 0;
	if (p->protocol == CEL_PROTO_TCP)
		return cfg->flags & CEL_CFG_F_DSR_TCP;
	if (p->protocol == CEL_PROTO_UDP)
		return cfg->flags & CEL_CFG_F_DSR_UDP;
	return 0;
}

/* Inserts the option after a header without options. Returns 0 or
 * CEL_REASON_NAT_FAILED (a header that has options already, no room). */
static __always_inline int dsr4_add_opt(struct __sk_buff *skb, struct pkt *p, __be32 addr,
					__be16 port)
{
	struct dsr_opt4 opt = {
		.type = CEL_DSR_OPT_TYPE, .len = CEL_DSR_OPT_LEN, .port = port, .addr = addr
	};
	__be16 old_w[2], new_w[2];
	__s64 sum;

	if (p->l4_off != CEL_IPV4_OPT_OFF)
		return CEL_REASON_NAT_FAILED;
	/* Version/IHL/TOS and the total length: the first 4 bytes. */
	if (bpf_skb_load_bytes(skb, CEL_IPV4_HDR_OFF, old_w, sizeof(old_w)) < 0)
		return CEL_REASON_NAT_FAILED;
	new_w[0] = bpf_htons((bpf_ntohs(old_w[0]) & 0xf0ff) | (7 << 8));
	new_w[1] = bpf_htons(bpf_ntohs(old_w[1]) + CEL_DSR_OPT_LEN);
	if (bpf_skb_adjust_room(skb, CEL_DSR_OPT_LEN, BPF_ADJ_ROOM_NET, 0) < 0)
		return CEL_REASON_NAT_FAILED;
	if (bpf_skb_store_bytes(skb, CEL_IPV4_HDR_OFF, new_w, sizeof(new_w), 0) < 0 ||
	    bpf_skb_store_bytes(skb, CEL_IPV4_OPT_OFF, &opt, sizeof(opt), 0) < 0)
		return CEL_REASON_NAT_FAILED;
	sum = bpf_csum_diff((__be32 *)old_w, sizeof(old_w), (__be32 *)new_w, sizeof(new_w), 0);
	if (sum < 0)
		return CEL_REASON_NAT_FAILED;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&opt, sizeof(opt), sum);
	if (sum < 0)
		return CEL_REASON_NAT_FAILED;
	if (bpf_l3_csum_replace(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, check), 0, sum,
				0) < 0)
		return CEL_REASON_NAT_FAILED;
	p->l4_off += CEL_DSR_OPT_LEN;
	return 0;
}

/* At the backend's node, for a local endpoint off a device: a DSR option
 * is believed only from another node, checked as the rest of native
 * routing checks a peer (the ipcache of the address it names must be
 * remote-node, and the frame must come from that node's own link-layer
 * address as the node's FIB resolves it). Returns 0 (no option, or
 * recorded in *opt), CEL_REASON_UNKNOWN_SENDER or CEL_REASON_MALFORMED. */
static __always_inline int dsr4_read_opt(struct __sk_buff *skb, const struct pkt *p,
					 const struct datapath_config *cfg, struct dsr_opt4 *opt)
{
	struct bpf_fib_lookup fib = {};
	__u8 smac[6];
	int i;
	int ret;

	opt->type = 0;
	/* A node in snat mode takes no option: the cluster shares one mode. */
	if (!(cfg->flags & CEL_CFG_F_DSR) || p->l4_off < CEL_IPV4_OPT_OFF + CEL_DSR_OPT_LEN)
		return 0;
	if (bpf_skb_load_bytes(skb, CEL_IPV4_OPT_OFF, opt, sizeof(*opt)) < 0)
		return CEL_REASON_MALFORMED;
	if (opt->type != CEL_DSR_OPT_TYPE)
		return 0;
	if (opt->len != CEL_DSR_OPT_LEN)
		return CEL_REASON_MALFORMED;
	if (ipcache_identity4(cfg, opt->addr) != CEL_IDENTITY_REMOTE_NODE)
		return CEL_REASON_UNKNOWN_SENDER;
	fib.family = 2; /* AF_INET */
	fib.ipv4_dst = opt->addr;
	fib.ifindex = skb->ingress_ifindex;
	ret = bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_DIRECT);
	if (ret != BPF_FIB_LKUP_RET_SUCCESS || fib.ifindex != skb->ingress_ifindex)
		return CEL_REASON_UNKNOWN_SENDER;
	if (bpf_skb_load_bytes(skb, 6, smac, sizeof(smac)) < 0)
		return CEL_REASON_MALFORMED;
#pragma unroll
	for (i = 0; i < 6; i++)
		if (smac[i] != fib.dmac[i])
			return CEL_REASON_UNKNOWN_SENDER;
	return 0;
}

/* After the backend's ingress admitted the connection: its replies leave
 * with the frontend (opt) as their source. */
static __always_inline int dsr4_record(const struct pkt *p, const struct dsr_opt4 *opt)
{
	struct snat4_value v = { .addr = opt->addr, .port = opt->port };
	struct ct_key rk = {
		.saddr = p->daddr,
		.daddr = p->saddr,
		.sport = p->dport,
		.dport = p->sport,
		.protocol = p->protocol,
		.flags = CEL_SNAT_F_DSR,
	};

	return bpf_map_update_elem(&cel_snat4, &rk, &v, BPF_ANY) < 0 ? CEL_REASON_NAT_FAILED : 0;
}

/* A backend's reply on a DSR connection: its source becomes the frontend.
 * Returns 1 if translated, 0 if no such reply, or -CEL_REASON_NAT_FAILED. */
static __always_inline int dsr4_reply(struct __sk_buff *skb, struct pkt *p,
				      const struct datapath_config *cfg)
{
	struct snat4_value *v;
	struct ct_key rk = {};

	if (!(cfg->flags & CEL_CFG_F_DSR) ||
	    (p->protocol != CEL_PROTO_TCP && p->protocol != CEL_PROTO_UDP))
		return 0;
	ct_key_from_pkt(&rk, p, CEL_SNAT_F_DSR);
	v = bpf_map_lookup_elem(&cel_snat4, &rk);
	if (!v)
		return 0;
	return nat4_rewrite(skb, p, NAT_SRC, v->addr, v->port) ? -CEL_REASON_NAT_FAILED : 1;
}

#endif /* CELLIUM_LIB_DSR_H */
