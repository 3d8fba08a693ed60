/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Connection tracking over cel_ct4 and cel_ct6. An entry is keyed on the
 * tuple of the connection's first packet; a packet whose tuple is found is
 * ESTABLISHED (forward), one whose reversed tuple is found is a REPLY,
 * anything else is NEW and goes through policy before ct_create records it.
 * Entries are the same for both families; only the keys differ.
 */
#ifndef CELLIUM_LIB_CONNTRACK_H
#define CELLIUM_LIB_CONNTRACK_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "ipv6.h"
#include "maps.h"
#include "packet.h"

#define CEL_NSEC_PER_SEC 1000000000ULL

enum ct_status {
	CT_NEW = 0,
	CT_ESTABLISHED = 1,
	CT_REPLY = 2,
	/* Internal to the lookups: a new connection reusing a closing tuple. */
	CT_REOPEN = 3,
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
	case CEL_PROTO_ICMPV6:
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

/* What conntrack reads of a packet, whatever its family. */
struct ct_pkt {
	__u32 len;
	__u8 protocol;
	__u8 tcp_flags;
};

static __always_inline void ct_account(struct ct_entry *e, int dir, const struct ct_pkt *p,
				       const struct datapath_config *cfg, __u64 now)
{
	__u8 state = e->state;
	__u64 expires;

	if (cfg && (cfg->flags & CEL_CFG_F_CT_ACCOUNTING)) {
		int d = dir == CEL_CT_FORWARD ? CEL_CT_FORWARD : CEL_CT_REPLY;

		__sync_fetch_and_add(&e->packets[d], 1);
		__sync_fetch_and_add(&e->bytes[d], p->len);
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
static __always_inline int ct_is_reopen(const struct ct_entry *e, const struct ct_pkt *p)
{
	return p->protocol == CEL_PROTO_TCP && e->state == CEL_CT_STATE_CLOSING &&
	       (p->tcp_flags & (CEL_TCP_SYN | CEL_TCP_ACK)) == CEL_TCP_SYN;
}

static __always_inline struct ct_pkt ct_pkt4(const struct pkt *p)
{
	struct ct_pkt c = { .len = p->len, .protocol = p->protocol, .tcp_flags = p->tcp_flags };

	return c;
}

static __always_inline struct ct_pkt ct_pkt6(const struct pkt6 *p)
{
	struct ct_pkt c = { .len = p->len, .protocol = p->protocol, .tcp_flags = p->tcp_flags };

	return c;
}

/* A found entry's status for this packet, accounting for it; CT_NEW if the
 * entry is missing or expired, CT_REOPEN if the packet starts a new
 * connection on a closing one. */
static __always_inline int ct_found(struct ct_entry *e, int dir, const struct ct_pkt *p,
				    const struct datapath_config *cfg, __u64 now,
				    struct ct_entry **out)
{
	if (!e || e->expires_ns <= now)
		return CT_NEW;
	if (dir == CEL_CT_FORWARD && ct_is_reopen(e, p))
		return CT_REOPEN;
	ct_account(e, dir, p, cfg, now);
	*out = e;
	return dir == CEL_CT_FORWARD ? CT_ESTABLISHED : CT_REPLY;
}

/* The flag of the end a packet of direction `ct` (CT_ESTABLISHED or
 * CT_REPLY) is delivered to. */
static __always_inline __u8 ct_receiver_flag(int ct)
{
	return ct == CT_REPLY ? CEL_CT_F_SRC_LOCAL : CEL_CT_F_DST_LOCAL;
}

/* Whether a packet of a known connection, delivered to the local endpoint
 * `dst`, must still pass its ingress policy: the entry was recorded while
 * the receiving end was not a local endpoint (a connection to "somewhere
 * off the node" at an address a new endpoint now has). */
static __always_inline int ct_unchecked(int ct, const struct ct_entry *e, const void *dst)
{
	return (ct == CT_ESTABLISHED || ct == CT_REPLY) && e && dst &&
	       !(e->flags & ct_receiver_flag(ct));
}

/* After the receiving end's ingress policy admitted the packet: the entry
 * is trusted for that end from now on. */
static __always_inline void ct_mark_checked(struct ct_entry *e, int ct)
{
	__u8 flag = ct_receiver_flag(ct);

	/* A plain store (no byte atomics): a racing update of the other flag
	 * can only be lost, and then that end is checked once more. */
	if (!(e->flags & flag))
		e->flags |= flag;
}

/* A new connection's entry. */
static __always_inline void ct_entry_init(struct ct_entry *e, const struct ct_pkt *p,
					  const struct datapath_config *cfg, __u64 now,
					  __u16 rev_nat_id, __u32 backend_id)
{
	e->created_ns = now;
	e->packets[CEL_CT_FORWARD] = 1;
	e->bytes[CEL_CT_FORWARD] = p->len;
	e->rev_nat_id = rev_nat_id;
	e->backend_id = backend_id;
	e->state = CEL_CT_STATE_ESTABLISHED;
	if (p->protocol == CEL_PROTO_TCP) {
		e->tcp_flags[CEL_CT_FORWARD] = p->tcp_flags;
		/* Mid-stream packets (no SYN) of an unknown connection, e.g.
		 * after the table was flushed, resume as established. */
		if ((p->tcp_flags & (CEL_TCP_SYN | CEL_TCP_ACK)) == CEL_TCP_SYN)
			e->state = CEL_CT_STATE_SYN;
		e->state = ct_tcp_state(e->tcp_flags[CEL_CT_FORWARD], 0, e->state);
	}
	e->expires_ns = now + ct_timeout(cfg, p->protocol, e->state) * CEL_NSEC_PER_SEC;
}

/* Looks up `key` (built from the packet) forward, then reversed. */
static __always_inline int ct_lookup4(const struct ct_key *key, const struct pkt *p,
				      const struct datapath_config *cfg, __u64 now,
				      struct ct_entry **out)
{
	struct ct_pkt c = ct_pkt4(p);
	struct ct_key rev = {};
	int ret;

	ret = ct_found(bpf_map_lookup_elem(&cel_ct4, key), CEL_CT_FORWARD, &c, cfg, now, out);
	if (ret != CT_NEW)
		return ret == CT_REOPEN ? CT_NEW : ret;
	rev.saddr = key->daddr;
	rev.daddr = key->saddr;
	rev.sport = key->dport;
	rev.dport = key->sport;
	rev.protocol = key->protocol;
	rev.flags = key->flags;
	return ct_found(bpf_map_lookup_elem(&cel_ct4, &rev), CEL_CT_REPLY, &c, cfg, now, out);
}

/* Records a new connection; returns 0 or CEL_REASON_CT_FULL. */
static __always_inline int ct_create4_flags(const struct ct_key *key, const struct pkt *p,
					    const struct datapath_config *cfg, __u64 now,
					    __u16 rev_nat_id, __u32 backend_id, __u8 flags)
{
	struct ct_pkt c = ct_pkt4(p);
	struct ct_entry e = {};

	ct_entry_init(&e, &c, cfg, now, rev_nat_id, backend_id);
	e.flags = flags;
	if (bpf_map_update_elem(&cel_ct4, key, &e, BPF_ANY) < 0)
		return CEL_REASON_CT_FULL;
	return 0;
}

static __always_inline int ct_create4(const struct ct_key *key, const struct pkt *p,
				      const struct datapath_config *cfg, __u64 now,
				      __u16 rev_nat_id, __u32 backend_id)
{
	return ct_create4_flags(key, p, cfg, now, rev_nat_id, backend_id, 0);
}

static __always_inline void ct6_key_from_pkt(struct ct6_key *key, const struct pkt6 *p, __u8 flags)
{
	__builtin_memcpy(key->saddr, p->saddr, 16);
	__builtin_memcpy(key->daddr, p->daddr, 16);
	key->sport = p->sport;
	key->dport = p->dport;
	key->protocol = p->protocol;
	key->flags = flags;
	key->pad = 0;
}

static __always_inline int ct_lookup6(const struct ct6_key *key, const struct pkt6 *p,
				      const struct datapath_config *cfg, __u64 now,
				      struct ct_entry **out)
{
	struct ct_pkt c = ct_pkt6(p);
	struct ct6_key rev = {};
	int ret;

	ret = ct_found(bpf_map_lookup_elem(&cel_ct6, key), CEL_CT_FORWARD, &c, cfg, now, out);
	if (ret != CT_NEW)
		return ret == CT_REOPEN ? CT_NEW : ret;
	__builtin_memcpy(rev.saddr, key->daddr, 16);
	__builtin_memcpy(rev.daddr, key->saddr, 16);
	rev.sport = key->dport;
	rev.dport = key->sport;
	rev.protocol = key->protocol;
	rev.flags = key->flags;
	return ct_found(bpf_map_lookup_elem(&cel_ct6, &rev), CEL_CT_REPLY, &c, cfg, now, out);
}

static __always_inline int ct_create6_flags(const struct ct6_key *key, const struct pkt6 *p,
					    const struct datapath_config *cfg, __u64 now,
					    __u16 rev_nat_id, __u32 backend_id, __u8 flags)
{
	struct ct_pkt c = ct_pkt6(p);
	struct ct_entry e = {};

	ct_entry_init(&e, &c, cfg, now, rev_nat_id, backend_id);
	e.flags = flags;
	if (bpf_map_update_elem(&cel_ct6, key, &e, BPF_ANY) < 0)
		return CEL_REASON_CT_FULL;
	return 0;
}

static __always_inline int ct_create6(const struct ct6_key *key, const struct pkt6 *p,
				      const struct datapath_config *cfg, __u64 now,
				      __u16 rev_nat_id, __u32 backend_id)
{
	return ct_create6_flags(key, p, cfg, now, rev_nat_id, backend_id, 0);
}

#endif /* CELLIUM_LIB_CONNTRACK_H */
