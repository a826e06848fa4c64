//! f32 elementwise ops. OWNER: lead.
