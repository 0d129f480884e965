Code.require_file("support.exs", __DIR__)

defmodule ExBurn.Server.OpenAIClientTest do
  # The official `openai` Python package against the server: what people point at llama.cpp's
  # server, Ollama or vLLM must work here unchanged. Skipped without python3 and the package
  # (pip install openai) or without the test models.
  use ExUnit.Case, async: false

  alias ExBurn.ServerTest.Support

  python = System.find_executable("python3")

  openai? =
    python != nil and
      match?({_, 0}, System.cmd(python, ["-c", "import openai"], stderr_to_stdout: true))

  @python python
  @moduletag skip:
               (!openai? && "python3 with the openai package is needed (pip install openai)") ||
                 Support.skip_without_models()
  @moduletag timeout: 300_000

  @emb Support.embedding_id()
  @llm Support.llm_id()

  @script ~S"""
  import json, sys
  import openai

  base_url, key, emb, llm = sys.argv[1:5]
  client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
  out = {}

  out["models"] = sorted(m.id for m in client.models.list())
  out["model"] = client.models.retrieve(llm).id

  texts = ["A cat sits on the mat.", "Un chat est assis."]
  r = client.embeddings.create(model=emb, input=texts)  # the client asks for base64 by default
  out["embeddings"] = [list(map(float, d.embedding)) for d in r.data]
  out["embedding_usage"] = r.usage.prompt_tokens
  r = client.embeddings.create(model=emb, input=texts[0], encoding_format="float")
  out["embedding_float"] = r.data[0].embedding

  r = client.completions.create(model=llm, prompt="The capital of France is", max_tokens=8, temperature=0)
  out["completion"] = {"text": r.choices[0].text, "finish_reason": r.choices[0].finish_reason,
                       "usage": [r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens]}

  messages = [{"role": "user", "content": "Name a fruit."}]
  r = client.chat.completions.create(model=llm, messages=messages, max_tokens=10, temperature=0)
  out["chat"] = {"content": r.choices[0].message.content, "role": r.choices[0].message.role,
                 "finish_reason": r.choices[0].finish_reason, "completion_tokens": r.usage.completion_tokens}

  pieces, finish, usage = [], None, None
  stream = client.chat.completions.create(model=llm, messages=messages, max_tokens=10, temperature=0,
                                          stream=True, stream_options={"include_usage": True})
  for chunk in stream:
      if chunk.usage is not None:
          usage = chunk.usage.completion_tokens
      for c in chunk.choices:
          if c.delta.content:
              pieces.append(c.delta.content)
          if c.finish_reason:
              finish = c.finish_reason
  out["chat_stream"] = {"content": "".join(pieces), "pieces": len(pieces), "finish_reason": finish, "usage": usage}

  pieces = []
  for chunk in client.completions.create(model=llm, prompt="The capital of France is", max_tokens=8,
                                         temperature=0, stream=True):
      pieces.append(chunk.choices[0].text)
  out["completion_stream"] = "".join(pieces)

  def error(call):
      try:
          call()
          return None
      except openai.APIStatusError as e:
          return {"status": e.status_code, "class": type(e).__name__, "code": (e.body or {}).get("code")}

  out["unknown_model"] = error(lambda: client.chat.completions.create(model="nope", messages=messages))
  out["n2"] = error(lambda: client.chat.completions.create(model=llm, messages=messages, n=2))
  bad = openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0)
  out["bad_key"] = error(lambda: bad.models.list())
  print(json.dumps(out))
  """

  setup_all do
    name = :openai_client_test
    start_supervised!({ExBurn.Server, name: name, port: 0, token: "sk-test", preload: :all})
    {:ok, embedding} = ExBurn.Embedding.load(@emb)
    {:ok, llm} = ExBurn.LLM.load(@llm)
    %{url: ExBurn.Server.url(name), embedding: embedding, llm: llm}
  end

  test "the openai package's calls work and give ExBurn's answers", %{
    url: url,
    embedding: embedding,
    llm: llm
  } do
    script = Path.join(System.tmp_dir!(), "exburn_openai_client_#{System.unique_integer([:positive])}.py")
    File.write!(script, @script)

    {out, status} = System.cmd(@python, [script, url <> "/v1", "sk-test", @emb, @llm], stderr_to_stdout: true)
    File.rm(script)
    assert status == 0, out
    result = out |> String.split("\n", trim: true) |> List.last() |> ExBurn.JSON.decode!()

    assert result["models"] == Enum.sort([@emb, @llm])
    assert result["model"] == @llm

    texts = ["A cat sits on the mat.", "Un chat est assis."]
    {:ok, vectors} = ExBurn.Embedding.embed(embedding, texts)
    assert result["embeddings"] == vectors
    assert result["embedding_float"] == hd(vectors)
    {:ok, ids} = ExBurn.Embedding.tokenize(embedding, texts)
    assert result["embedding_usage"] == ids |> Enum.map(&length/1) |> Enum.sum()

    {:ok, completion} = ExBurn.LLM.generate(llm, "The capital of France is", max_tokens: 8, greedy: true)
    p = completion.usage.prompt_tokens

    assert result["completion"] == %{
             "text" => completion.text,
             "finish_reason" => "length",
             "usage" => [p, 8, p + 8]
           }

    assert result["completion_stream"] == completion.text

    {:ok, chat} =
      ExBurn.LLM.generate(llm, [%{role: "user", content: "Name a fruit."}], max_tokens: 10, greedy: true)

    finish = Atom.to_string(chat.finish_reason)
    tokens = chat.usage.completion_tokens

    assert result["chat"] == %{
             "content" => chat.text,
             "role" => "assistant",
             "finish_reason" => finish,
             "completion_tokens" => tokens
           }

    assert %{"content" => streamed, "pieces" => pieces, "finish_reason" => ^finish, "usage" => ^tokens} =
             result["chat_stream"]

    assert streamed == chat.text
    assert pieces > 1

    assert result["unknown_model"] == %{
             "status" => 404,
             "class" => "NotFoundError",
             "code" => "model_not_found"
           }

    assert %{"status" => 400, "class" => "BadRequestError"} = result["n2"]

    assert result["bad_key"] == %{
             "status" => 401,
             "class" => "AuthenticationError",
             "code" => "invalid_api_key"
           }
  end
end
