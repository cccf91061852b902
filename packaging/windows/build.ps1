# UNVERIFIED: written on Linux, never run on Windows. Build Hearth's per-user Windows installer:
#
#   powershell -ExecutionPolicy Bypass -File packaging\windows\build.ps1 [-Gpu cuda|vulkan|cpu]
#
# Makes dist\hearth\ (PyInstaller one-folder bundle: hearth.exe is the CLI and, with no
# arguments, the window; hearthw.exe is the same program without a console, for the Start menu)
# and dist\hearth-VERSION-windows-x86_64-setup.exe (Inno Setup 6: no admin rights, installs to
# %LOCALAPPDATA%\Programs\Hearth, Start-menu entry, uninstaller).
# The llama.cpp backend: -Gpu, else $env:HEARTH_GPU, else CUDA when nvcc or nvidia-smi is on
# PATH, Vulkan when the Vulkan SDK is ($env:VULKAN_SDK), else CPU. $env:PYTHON: an interpreter
# with Hearth, pyinstaller and pillow whose llama-cpp-python has that backend (checked, never
# rebuilt); without it the script makes build\venv-BACKEND with the backend's CMAKE_ARGS.
# Needs: Python 3.11+ (the py launcher), Visual Studio Build Tools (C++), Inno Setup 6 (ISCC.exe
# on PATH or in its default folder); for CUDA the CUDA Toolkit (its DLLs are bundled).
param([ValidateSet("cuda", "vulkan", "cpu", "")][string]$Gpu = "")
$ErrorActionPreference = "Stop"
$Root = (Resolve-Path "$PSScriptRoot\..\..").Path
$Dist = Join-Path $Root "dist"
$Work = Join-Path $Root "build\windows"

function Detect-Backend {
    if ($Gpu) { return $Gpu }
    if ($env:HEARTH_GPU) {
        if ($env:HEARTH_GPU -notin @("cuda", "vulkan", "cpu")) { throw "HEARTH_GPU must be cuda, vulkan or cpu" }
        return $env:HEARTH_GPU
    }
    if ((Get-Command nvcc -ErrorAction SilentlyContinue) -or (Get-Command nvidia-smi -ErrorAction SilentlyContinue)) { return "cuda" }
    if ($env:VULKAN_SDK) { return "vulkan" }
    return "cpu"
}

function Cmake-Args([string]$Backend) {
    switch ($Backend) {
        "cuda" { "-DGGML_CUDA=on" }
        "vulkan" { "-DGGML_VULKAN=on" }
        default { "-DGGML_NATIVE=off" }  # not the build machine's CPU: the installer runs elsewhere
    }
}

function Has-Backend([string]$Py, [string]$Backend) {
    $lib = @{ cuda = "ggml-cuda"; vulkan = "ggml-vulkan"; cpu = "ggml-cpu" }[$Backend]
    & $Py -c "import pathlib, sys, llama_cpp; d = pathlib.Path(llama_cpp.__file__).parent / 'lib'; sys.exit(0 if any(p.name.startswith('$lib') for p in d.iterdir()) else 1)"
    return $LASTEXITCODE -eq 0
}

$Backend = Detect-Backend
$LlamaVersion = (Select-String -Path "$Root\pyproject.toml" -Pattern '"llama-cpp-python==([0-9.]+)"').Matches[0].Groups[1].Value
if ($env:PYTHON) {
    $Py = $env:PYTHON
    if (-not (Has-Backend $Py $Backend)) {
        throw "llama-cpp-python in $Py lacks the $Backend backend: set CMAKE_ARGS='$(Cmake-Args $Backend)' and pip install --force-reinstall --no-cache-dir --no-deps llama-cpp-python==$LlamaVersion"
    }
} else {
    $Venv = Join-Path $Root "build\venv-$Backend"
    $Py = Join-Path $Venv "Scripts\python.exe"
    if (-not (Test-Path $Py)) {
        py -3.11 -m venv $Venv
        & $Py -m pip install -q --upgrade pip
        $env:CMAKE_ARGS = Cmake-Args $Backend
        # the speech extra: faster-whisper and PySide6's QtMultimedia (the chat's Dictate button)
        & $Py -m pip install --no-cache-dir "${Root}[speech]" "pyinstaller>=6.10" pillow
        if ($LASTEXITCODE -ne 0) { throw "pip install failed" }
    }
    if (-not (Has-Backend $Py $Backend)) { throw "the build venv's llama-cpp-python lacks $Backend" }
}
$Version = & $Py -c "import tomllib; print(tomllib.load(open(r'$Root\pyproject.toml', 'rb'))['project']['version'])"
Write-Host "== Hearth $Version, llama.cpp backend: $Backend, python: $Py"

Remove-Item -Recurse -Force -ErrorAction SilentlyContinue $Work, (Join-Path $Dist "hearth")
New-Item -ItemType Directory -Force $Work, $Dist | Out-Null
$Icon = Join-Path $Work "hearth.ico"
& $Py -c "from PIL import Image; Image.open(r'$Root\assets\hearth.png').save(r'$Icon', sizes=[(16,16),(24,24),(32,32),(48,48),(64,64),(128,128),(256,256)])"

Write-Host "== PyInstaller"
$env:PYTHONPATH = $Root
$env:HEARTH_VERSION = $Version
$env:HEARTH_ICON = $Icon
& $Py -m PyInstaller --noconfirm --clean --log-level WARN --distpath $Dist --workpath "$Work\pyinstaller" "$Root\packaging\hearth.spec"
if ($LASTEXITCODE -ne 0) { throw "PyInstaller failed" }
$Got = & "$Dist\hearth\hearth.exe" --version
if ($Got -ne "hearth $Version") { throw "the bundle says '$Got'" }

Write-Host "== Inno Setup"
$Iscc = (Get-Command ISCC.exe -ErrorAction SilentlyContinue).Source
if (-not $Iscc) { $Iscc = "${env:ProgramFiles(x86)}\Inno Setup 6\ISCC.exe" }
& $Iscc "/DAppVersion=$Version" "/DSourceDir=$Dist\hearth" "/DOutputDir=$Dist" "/DIconFile=$Icon" "/DBackend=$Backend" "$PSScriptRoot\hearth.iss"
if ($LASTEXITCODE -ne 0) { throw "ISCC failed" }
Get-Item "$Dist\hearth-$Version-windows-x86_64-setup.exe"
