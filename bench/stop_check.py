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
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def turns(trajectories: Path):
    """(task id, conversation before the reply, the recorded reply) for every assistant turn."""
    for line in trajectories.read_text().splitlines():
        record = json.loads(line)
        messages = [{"role": m["role"], "content": m["content"]} for m in record["messages"]]
        for index, message in enumerate(messages):
            if message["role"] == "assistant":
                yield record["task_id"], messages[:index], message["content"]


def main(folder: Path, trajectories: Path, outcomes: Path | None = None) -> dict:
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = model.generation_config
    stops = set(config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stopped = same = 0
    p_end: list[float] = []
    by_task: dict[str, list[int]] = {}
    for task, before, recorded in turns(trajectories):
        prompt = tokenizer.apply_chat_template(
            before, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        ids = prompt["input_ids"]
        with torch.no_grad():
            reply = model.generate(ids, attention_mask=torch.ones_like(ids))[0, ids.shape[1] :].tolist()
            command = tokenizer(recorded, add_special_tokens=False).input_ids
            logits = model(torch.tensor([ids[0].tolist() + command])).logits[0, -1]
        p_end.append(float(torch.softmax(logits.float(), -1)[end]))
        stop = bool(reply) and reply[-1] in stops
        by_task.setdefault(task, []).append(int(stop))
        stopped += stop
        same += tokenizer.decode(reply, skip_special_tokens=True).strip() == recorded.strip()
    if outcomes:
        outcomes.write_text(json.dumps(dict(sorted(by_task.items())), indent=1) + "\n")
    return {
        "replies": len(p_end),
        "stopped": stopped,
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
