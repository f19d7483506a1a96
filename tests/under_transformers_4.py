"""Run by tests/test_checkpoint_portability.py under transformers 4.57 (PYTHONPATH: the second
environment first): load a checkpoint as a user of that version would, and report what it
computes on a chat prompt: the prompt's token ids and RoPE base as JSON on stdout, the logits
as a .npy file.

    python tests/under_transformers_4.py CHECKPOINT_DIR LOGITS.npy MESSAGES_JSON
"""

import json
import sys

import numpy
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

directory, logits_file, messages = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(directory)
model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
ids = tokenizer.encode(text, add_special_tokens=False)
with torch.no_grad():
    numpy.save(logits_file, model(torch.tensor([ids])).logits[0].numpy())
print(json.dumps({"transformers": transformers.__version__, "ids": ids, "rope_theta": model.config.rope_theta}))
