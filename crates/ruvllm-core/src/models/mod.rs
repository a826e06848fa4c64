//! Model architectures. OWNER: lead.
