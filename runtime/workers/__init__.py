"""What runs in another Python (vLLM's or llama.cpp's venv, which draftsmith's does not have), and the pipe.

`jsonl_channel` (the workers' side of the pipe: reply channel, error replies, the engine's start-up answer,
request loop; standard library only), `worker_process` (start a JSON-lines worker in its own session, read
its replies, stop it; draftsmith's side), and the scripts that run under vLLM's Python, standard library only,
by path: `vllm_worker` (the bench's vLLM engine), `vllm_data_worker` (regeneration and capture for the data
steps), `vllm_llm_args` (the LLM arguments both vLLM workers build alike), `vllm_hidden_connector` (vLLM's
hidden-states connector made to work on a CPU), and `llamacpp_worker` (the bench's llama.cpp engine, under
llama-cpp-python's Python).
"""
