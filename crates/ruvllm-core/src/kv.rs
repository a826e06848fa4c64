//! KV cache. OWNER: lead.
