/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Connection tracking over cel_ct4. An entry is keyed on the tuple of the
 * connection's first packet; a packet whose tuple is found is ESTABLISHED
 * (forward), one whose reversed tuple is found is a REPLY, anything else is
 * NEW and goes through policy before ct_create records it.
 */
#ifndef CELLIUM_LIB_CONNTRACK_H
#define CELLIUM_LIB_CONNTRACK_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"
#include "packet.h"

#define CEL_NSEC_PER_SEC 1000000000ULL

enum ct_status {
	CT_NEW = 0,
	CT_ESTABLISHED = 1,
	CT_REPLY = 2,
};

static __always_inline void ct_key_from_pkt(struct ct_key *key, const struct pkt *p, __u8 flags)
{
	key->saddr = p->saddr;
	key->daddr = p->daddr;
	key->sport = p->sport;
	key->dport = p->dport;
	key->protocol = p->protocol;
	key->flags = flags;
	key->pad = 0;
}

static __always_inline __u32 pick(__u32 configured, __u32 fallback)
{
	return configured ? configured : fallback;
}

/* Lifetime in seconds of an entry of `protocol` in `state`. */
static __always_inline __u64 ct_timeout(const struct datapath_config *cfg, __u8 protocol,
					__u8 state)
{
	struct datapath_config none = {};

	if (!cfg)
		cfg = &none;
	switch (protocol) {
	case CEL_PROTO_TCP:
		if (state == CEL_CT_STATE_SYN)
			return pick(cfg->ct_tcp_syn, CEL_CT_DEFAULT_TCP_SYN);
		if (state == CEL_CT_STATE_CLOSING)
			return pick(cfg->ct_tcp_closing, CEL_CT_DEFAULT_TCP_CLOSING);
		return pick(cfg->ct_tcp_established, CEL_CT_DEFAULT_TCP_ESTABLISHED);
	case CEL_PROTO_UDP:
	case CEL_PROTO_SCTP:
		return pick(cfg->ct_udp, CEL_CT_DEFAULT_UDP);
	case CEL_PROTO_ICMP:
		return pick(cfg->ct_icmp, CEL_CT_DEFAULT_ICMP);
	default:
		return pick(cfg->ct_other, CEL_CT_DEFAULT_OTHER);
	}
}

/* TCP state after both directions' accumulated flags. */
static __always_inline __u8 ct_tcp_state(__u8 fwd, __u8 rev, __u8 current)
{
	/* A reset, or a FIN from each side, ends the connection. */
	if (((fwd | rev) & CEL_TCP_RST) || ((fwd & CEL_TCP_FIN) && (rev & CEL_TCP_FIN)))
		return CEL_CT_STATE_CLOSING;
	/* The reply side acknowledged: the handshake is done. */
	if (current == CEL_CT_STATE_SYN && (rev & CEL_TCP_ACK))
		return CEL_CT_STATE_ESTABLISHED;
	return current;
}

static __always_inline void ct_account(struct ct_entry *e, int dir, const struct pkt *p,
				       const struct datapath_config *cfg, __u64 now)
{
	__u8 state = e->state;
	__u64 expires;

	if (dir == CEL_CT_FORWARD) {
		__sync_fetch_and_add(&e->packets[CEL_CT_FORWARD], 1);
		__sync_fetch_and_add(&e->bytes[CEL_CT_FORWARD], p->len);
	} else {
		__sync_fetch_and_add(&e->packets[CEL_CT_REPLY], 1);
		__sync_fetch_and_add(&e->bytes[CEL_CT_REPLY], p->len);
	}

	if (p->protocol == CEL_PROTO_TCP) {
		__u8 fwd = e->tcp_flags[CEL_CT_FORWARD];
		__u8 rev = e->tcp_flags[CEL_CT_REPLY];

		/* Store only on change: the entry is shared by every CPU. */
		if (dir == CEL_CT_FORWARD) {
			if ((fwd | p->tcp_flags) != fwd) {
				fwd |= p->tcp_flags;
				e->tcp_flags[CEL_CT_FORWARD] = fwd;
			}
		} else if ((rev | p->tcp_flags) != rev) {
			rev |= p->tcp_flags;
			e->tcp_flags[CEL_CT_REPLY] = rev;
		}
		state = ct_tcp_state(fwd, rev, state);
	}

	expires = now + ct_timeout(cfg, p->protocol, state) * CEL_NSEC_PER_SEC;
	/* Refreshing the deadline at most once a second keeps the cache line
	 * quiet; a state change (shorter timeout) is always written. */
	if (state != e->state) {
		e->state = state;
		e->expires_ns = expires;
	} else if (expires > e->expires_ns + CEL_NSEC_PER_SEC) {
		e->expires_ns = expires;
	}
}

/* A SYN alone on a closing entry is a new connection reusing the tuple. */
static __always_inline int ct_is_reopen(const struct ct_entry *e, const struct pkt *p)
{
	return p->protocol == CEL_PROTO_TCP && e->state == CEL_CT_STATE_CLOSING &&
	       (p->tcp_flags & (CEL_TCP_SYN | CEL_TCP_ACK)) == CEL_TCP_SYN;
}

/* Looks up `key` (built from the packet) forward, then reversed. */
static __always_inline int ct_lookup4(const struct ct_key *key, const struct pkt *p,
				      const struct datapath_config *cfg, __u64 now,
				      struct ct_entry **out)
{
	struct ct_key rev = {};
	struct ct_entry *e;

	e = bpf_map_lookup_elem(&cel_ct4, key);
	if (e && e->expires_ns > now) {
		if (ct_is_reopen(e, p))
			return CT_NEW;
		ct_account(e, CEL_CT_FORWARD, p, cfg, now);
		*out = e;
		return CT_ESTABLISHED;
	}

	rev.saddr = key->daddr;
	rev.daddr = key->saddr;
	rev.sport = key->dport;
	rev.dport = key->sport;
	rev.protocol = key->protocol;
	rev.flags = key->flags;
	e = bpf_map_lookup_elem(&cel_ct4, &rev);
	if (e && e->expires_ns > now) {
		ct_account(e, CEL_CT_REPLY, p, cfg, now);
		*out = e;
		return CT_REPLY;
	}
	return CT_NEW;
}

/* Records a new connection; returns 0 or CEL_REASON_CT_FULL. */
static __always_inline int ct_create4(const struct ct_key *key, const struct pkt *p,
				      const struct datapath_config *cfg, __u64 now,
				      __u16 rev_nat_id, __u32 backend_id)
{
	struct ct_entry e = {};

	e.created_ns = now;
	e.packets[CEL_CT_FORWARD] = 1;
	e.bytes[CEL_CT_FORWARD] = p->len;
	e.rev_nat_id = rev_nat_id;
	e.backend_id = backend_id;
	e.state = CEL_CT_STATE_ESTABLISHED;
	if (p->protocol == CEL_PROTO_TCP) {
		e.tcp_flags[CEL_CT_FORWARD] = p->tcp_flags;
		/* Mid-stream packets (no SYN) of an unknown connection, e.g.
		 * after the table was flushed, resume as established. */
		if ((p->tcp_flags & (CEL_TCP_SYN | CEL_TCP_ACK)) == CEL_TCP_SYN)
			e.state = CEL_CT_STATE_SYN;
		e.state = ct_tcp_state(e.tcp_flags[CEL_CT_FORWARD], 0, e.state);
	}
	e.expires_ns = now + ct_timeout(cfg, p->protocol, e.state) * CEL_NSEC_PER_SEC;
	if (bpf_map_update_elem(&cel_ct4, key, &e, BPF_ANY) < 0)
		return CEL_REASON_CT_FULL;
	return 0;
}

#endif /* CELLIUM_LIB_CONNTRACK_H */
