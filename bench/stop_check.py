"""Does an exported model end its reply by itself, in plain transformers?

    agentgym export runs/RUN --out /tmp/exported
    python bench/stop_check.py /tmp/exported runs/RUN/rollouts/eval/step-NNNNNN.jsonl

For every assistant turn of a held-out evaluation the run recorded, the prompt is the
conversation before it through the tokenizer's own chat template, and the exported folder
generates greedily with its own generation config (no AgentGym code on the path). Prints
how many replies stopped (an end token within the config's ``max_new_tokens``), how many
equal the recorded command (played under constrained decoding), and the mean probability
of the end token right after the recorded command. Figures: bench/RESULTS.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def turns(trajectories: Path):
    """(conversation before the reply, the recorded reply) for every assistant turn."""
    for line in trajectories.read_text().splitlines():
        messages = [{"role": m["role"], "content": m["content"]} for m in json.loads(line)["messages"]]
        for index, message in enumerate(messages):
            if message["role"] == "assistant":
                yield messages[:index], message["content"]


def main(folder: Path, trajectories: Path) -> dict:
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = model.generation_config
    stops = set(config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stopped = same = 0
    p_end: list[float] = []
    for before, recorded in turns(trajectories):
        prompt = tokenizer.apply_chat_template(
            before, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        ids = prompt["input_ids"]
        with torch.no_grad():
            reply = model.generate(ids, attention_mask=torch.ones_like(ids))[0, ids.shape[1] :].tolist()
            command = tokenizer(recorded, add_special_tokens=False).input_ids
            logits = model(torch.tensor([ids[0].tolist() + command])).logits[0, -1]
        p_end.append(float(torch.softmax(logits.float(), -1)[end]))
        stopped += bool(reply) and reply[-1] in stops
        same += tokenizer.decode(reply, skip_special_tokens=True).strip() == recorded.strip()
    return {
        "replies": len(p_end),
        "stopped": stopped,
        "same_as_recorded": same,
        "max_new_tokens": config.max_new_tokens,
        "mean_p_end": round(sum(p_end) / len(p_end), 3),
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
