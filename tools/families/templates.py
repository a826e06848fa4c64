"""The chat templates of the families we run, rendered by transformers' own Jinja setup, as the
expected output for crates/ruvllm-core/tests/families.rs (our minijinja rendering must equal it).

Templates: llama.cpp's copies of the published ones (`models/templates/` in the llama.cpp source,
LLAMA_CPP_SRC). Writes OUT/templates/<name>.json: {template, bos, eos, cases: [{messages,
add_generation_prompt, expected}]}.

  python tools/families/templates.py --out target/families
"""
import argparse
import json
import os

from transformers.utils.chat_template_utils import _compile_jinja_template

SRC = os.environ.get("LLAMA_CPP_SRC", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".llama", "src-0.3.36"))
# (file in models/templates, bos, eos): the special tokens as the models' tokenizer configs name them.
TEMPLATES = [
    ("Qwen-Qwen3-0.6B", "", "<|im_end|>"),
    ("google-gemma-2-2b-it", "<bos>", "<eos>"),
    ("microsoft-Phi-3.5-mini-instruct", "<s>", "<|endoftext|>"),
    ("meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
    ("meta-llama-Llama-3.2-3B-Instruct", "<|begin_of_text|>", "<|eot_id|>"),
]
SYSTEM = {"role": "system", "content": "You are a concise assistant."}
TURNS = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Germany?\nAnswer in one word."},
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = os.path.join(args.out, "templates")
    os.makedirs(out, exist_ok=True)
    for name, bos, eos in TEMPLATES:
        src = open(os.path.join(SRC, "models", "templates", name + ".jinja")).read()
        tpl = _compile_jinja_template(src)
        cases = []
        # Gemma 2 refuses a system message (its template raises): only the turns for it.
        systems = [False] if "gemma-2" in name else [False, True]
        for system in systems:
            for gen in (True, False):
                msgs = ([SYSTEM] if system else []) + (TURNS if gen else TURNS[:2])
                text = tpl.render(messages=msgs, add_generation_prompt=gen, bos_token=bos, eos_token=eos)
                cases.append({"messages": msgs, "add_generation_prompt": gen, "expected": text})
        with open(os.path.join(out, name + ".json"), "w") as f:
            json.dump({"name": name, "template": src, "bos": bos, "eos": eos, "cases": cases}, f, indent=1)
        print(f"  template {name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
