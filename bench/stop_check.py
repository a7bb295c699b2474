"""Does an exported model end its reply by itself, in plain transformers?

    agentgym export runs/RUN --out /tmp/exported
    python bench/stop_check.py /tmp/exported runs/RUN/rollouts/eval/step-NNNNNN.jsonl [--outcomes F]

For every assistant turn of a held-out evaluation the run recorded, the prompt is the
conversation before it through the tokenizer's own chat template, and the exported folder
generates greedily with its own generation config (no AgentGym code on the path). Prints
how many replies stopped (an end token within the config's ``max_new_tokens``), how many
equal the recorded command (played under constrained decoding), and the mean probability
of the end token right after the recorded command; ``--outcomes`` also writes task -> one
0/1 per reply (stopped), the layout ``bench/pass_at_k.py`` tables. Figures:
bench/RESULTS.md."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache


def episodes(trajectories: Path):
    """(task id, [(conversation before the reply, the recorded reply) per assistant turn])."""
    for line in trajectories.read_text().splitlines():
        record = json.loads(line)
        messages = [{"role": m["role"], "content": m["content"]} for m in record["messages"]]
        turns = [(messages[:i], m["content"]) for i, m in enumerate(messages) if m["role"] == "assistant"]
        yield record["task_id"], turns


def replay(model, tokenizer, turns):
    """(greedy reply ids, P(end token | the recorded command)) per turn of one episode. Each
    turn's prompt extends the last one's, so the conversation's KV cache is kept and only new
    tokens are computed (a prompt that does not extend it starts a fresh cache)."""
    cache, cached = DynamicCache(), []
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for before, recorded in turns:
        ids = tokenizer.apply_chat_template(before, add_generation_prompt=True, return_dict=True)["input_ids"]
        if ids[: len(cached)] != cached:
            cache, cached = DynamicCache(), []
        if len(ids) - 1 > len(cached):  # the cache holds all but the prompt's last token
            model(torch.tensor([ids[len(cached) : -1]]), past_key_values=cache)
            cached = ids[:-1]
        prompt = torch.tensor([ids])
        reply = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), past_key_values=copy.deepcopy(cache)
        )
        command = tokenizer(recorded, add_special_tokens=False).input_ids
        logits = model(torch.tensor([ids[-1:] + command]), past_key_values=copy.deepcopy(cache)).logits[0, -1]
        yield reply[0, len(ids) :].tolist(), float(torch.softmax(logits.float(), -1)[end])


@torch.no_grad()
def main(folder: Path, trajectories: Path, outcomes: Path | None = None) -> dict:
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = model.generation_config
    stops = set(config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id])
    same = 0
    p_end: list[float] = []
    by_task: dict[str, list[int]] = {}
    for task, turns in episodes(trajectories):
        for (_, recorded), (reply, p) in zip(turns, replay(model, tokenizer, turns), strict=True):
            p_end.append(p)
            by_task.setdefault(task, []).append(int(bool(reply) and reply[-1] in stops))
            same += tokenizer.decode(reply, skip_special_tokens=True).strip() == recorded.strip()
    if outcomes:
        outcomes.write_text(json.dumps(dict(sorted(by_task.items())), indent=1) + "\n")
    return {
        "replies": len(p_end),
        "stopped": sum(map(sum, by_task.values())),
        "same_as_recorded": same,
        "max_new_tokens": config.max_new_tokens,
        "mean_p_end": round(sum(p_end) / len(p_end), 3),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="an exported model folder")
    parser.add_argument("trajectories", type=Path, help="a held-out evaluation's trajectories (JSONL)")
    parser.add_argument("--outcomes", type=Path, help="also write task -> one 0/1 per reply (stopped) here")
    args = parser.parse_args()
    print(json.dumps(main(args.folder, args.trajectories, args.outcomes)))
