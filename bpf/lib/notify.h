/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Metrics and events: every packet the programs decide on is counted once
 * under (direction, reason); drops and, when enabled, policy verdicts are
 * also reported through the ring buffer.
 */
#ifndef CELLIUM_LIB_NOTIFY_H
#define CELLIUM_LIB_NOTIFY_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"
#include "packet.h"

/* Who a verdict is about: filled in as the program learns it. */
struct trace {
	__u32 src_identity;
	__u32 dst_identity;
	__u16 endpoint_id;
	__u8 direction;
};

static __always_inline void count(__u8 direction, __u8 reason, __u32 len)
{
	__u32 key = (__u32)direction * CEL_REASON_SLOTS + reason;
	struct metrics_value *v = bpf_map_lookup_elem(&cel_metrics, &key);

	/* Per-CPU values: no other CPU writes this slot. */
	if (v) {
		v->packets += 1;
		v->bytes += len;
	}
}

static __always_inline void emit_event(struct __sk_buff *skb, const struct pkt *p,
				       const struct trace *t, __u8 type, __u8 reason,
				       __u8 verdict)
{
	struct event *e = bpf_ringbuf_reserve(&cel_events, sizeof(*e), 0);

	/* A full ring buffer loses the event, never the packet's verdict. */
	if (!e)
		return;
	e->ktime = bpf_ktime_get_ns();
	e->type = type;
	e->reason = reason;
	e->direction = t->direction;
	e->protocol = p->protocol;
	e->endpoint_id = t->endpoint_id;
	e->pad = 0;
	e->src_identity = t->src_identity;
	e->dst_identity = t->dst_identity;
	e->saddr = p->saddr;
	e->daddr = p->daddr;
	e->sport = p->sport;
	e->dport = p->dport;
	e->ifindex = skb->ifindex;
	e->len = p->len;
	e->verdict = verdict;
	e->pad2[0] = 0;
	e->pad2[1] = 0;
	e->pad2[2] = 0;
	bpf_ringbuf_submit(e, 0);
}

static __always_inline int drop(struct __sk_buff *skb, const struct pkt *p,
				const struct trace *t, __u8 reason)
{
	count(t->direction, reason, skb->len);
	emit_event(skb, p, t, CEL_EVENT_DROP, reason, CEL_VERDICT_DENIED);
	return TC_ACT_SHOT;
}

#endif /* CELLIUM_LIB_NOTIFY_H */
