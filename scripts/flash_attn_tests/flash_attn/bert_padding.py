from flashattn.bert_padding import *  # noqa: F401,F403
